package warehouse

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// A table's Kafka log may have several eras: the topic deleted and made
// again (the Kafka data lost), or another topic (kafka.topic_prefix
// changed). Offsets count within one era; event positions across all.
// Each lake file says which era wrote it (the topic and its ID).

// lakeSpan is a lake file of a table and the era of the Kafka log that
// wrote it.
type lakeSpan struct {
	path      string
	topic, id string // id "": a lake file older than lakeflow recording it
	part      int32
	last      int64
	maxSeq    change.LSN
}

// lakeSpans lists the lake files of t with their eras: from
// lakeflow.lake_files, or, for files it does not list (a new warehouse on
// an old lake), from their metadata.
func (w *Warehouse) lakeSpans(ctx context.Context, t *table) ([]lakeSpan, error) {
	parts, err := w.lake.Parts(lakeDir(t.schema))
	if err != nil || len(parts) == 0 {
		return nil, err
	}
	listed := map[string][2]string{}
	rows, err := w.conn.QueryContext(ctx, "SELECT path, topic, coalesce(topic_id, '') FROM lakeflow.lake_files WHERE source_table = ?", t.schema.ID())
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var path, topic, id string
		if err := rows.Scan(&path, &topic, &id); err != nil {
			rows.Close()
			return nil, err
		}
		listed[path] = [2]string{topic, id}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	var unlisted []string
	for _, p := range parts {
		if _, ok := listed[p.Path]; !ok {
			unlisted = append(unlisted, w.lake.Abs(p.Path))
		}
	}
	meta, err := w.lakeMetadata(ctx, unlisted)
	if err != nil {
		return nil, fmt.Errorf("read the metadata of the lake's files of %s: %w", t.schema.ID(), err)
	}
	out := make([]lakeSpan, len(parts))
	for i, p := range parts {
		era, ok := listed[p.Path]
		if !ok {
			m := meta[w.lake.Abs(p.Path)]
			era = [2]string{m[metaTopic], m[metaTopicID]}
		}
		out[i] = lakeSpan{path: p.Path, topic: era[0], id: era[1], part: p.Span.Partition, last: p.Span.Last, maxSeq: p.Span.MaxSeq}
	}
	return out, nil
}

// ReadingTopic tells the warehouse which era of topic, a table's topic,
// the consumer reads: the Kafka topic's ID. The lake's files of that era
// say which of its offsets the lake holds (a batch writes only what is
// beyond); events of other eras the lake holds after the floor are known
// by position (lakeflow_known): written by a batch that did not end at a
// transaction boundary, then sent again into this era, they are neither
// written to the lake again nor applied again. It is worked out again at
// every start, from the lake.
//
// A warehouse that has recorded no lake file of the table (a new one on
// an old lake: the warehouse was lost) is rebuilt from Kafka only if the
// lake holds no other era: else Kafka no longer has every event the lake
// has, and lakeflow backfill --all must rebuild it.
func (w *Warehouse) ReadingTopic(ctx context.Context, topic, id string) error {
	t := w.byTopic[topic]
	if t == nil {
		return nil
	}
	spans, err := w.lakeSpans(ctx, t)
	if err != nil {
		return err
	}
	var recorded int
	if err := w.conn.QueryRowContext(ctx, "SELECT count(*) FROM lakeflow.lake_files WHERE source_table = ?", t.schema.ID()).Scan(&recorded); err != nil {
		return err
	}
	high := map[int32]int64{}
	var others []string
	for _, s := range spans {
		if s.topic == topic && (s.id == id || s.id == "") {
			high[s.part] = max(high[s.part], s.last)
			continue
		}
		if recorded == 0 {
			return fmt.Errorf("%w: the lake holds events of %s that Kafka no longer has (%s, written from %s%s), and the warehouse does not: run lakeflow backfill --all, which rebuilds the warehouse from the lake",
				fault.ErrEnvironment, t.schema.ID(), s.path, s.topic, era(s.id))
		}
		if s.maxSeq > w.floor {
			others = append(others, literal(w.lake.Abs(s.path)))
		}
	}
	delete(w.lakeHigh, topic)
	for p, off := range high {
		w.raiseLakeHigh(topic, p, off)
	}
	if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("DELETE FROM lakeflow_known WHERE tbl = %d", t.id)); err != nil {
		return err
	}
	w.known[t] = len(others) > 0
	if len(others) == 0 {
		return nil
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow_known SELECT %d, _cdc_seq, _cdc_ord
		FROM read_parquet([%s]) WHERE _cdc_seq > %d`, t.id, strings.Join(others, ", "), w.floor))
	if err != nil {
		return fmt.Errorf("read the lake's events of %s after %s: %w", t.schema.ID(), w.floor, err)
	}
	return nil
}

// era names a topic's era for a message.
func era(id string) string {
	if id == "" {
		return ""
	}
	return " (topic ID " + id + ")"
}

// RestoreOffsets records where a warehouse rebuilt from the lake alone
// stands in each table's topic: after the last offset the lake holds of
// the era of its newest events (dead letters of that era included), so
// the next run reads Kafka from there, whatever it trimmed since.
func (w *Warehouse) RestoreOffsets(ctx context.Context) error {
	positions := map[string]TopicPosition{}
	for _, t := range w.tables {
		spans, err := w.lakeSpans(ctx, t)
		if err != nil || len(spans) == 0 {
			if err != nil {
				return err
			}
			continue
		}
		newest := spans[0]
		for _, s := range spans {
			if s.maxSeq > newest.maxSeq {
				newest = s
			}
		}
		if newest.topic != t.topic {
			continue // the newest events came from another topic: nothing of this one is read
		}
		pos := TopicPosition{ID: newest.id, Next: map[int32]int64{}}
		for _, s := range spans {
			if s.topic == newest.topic && s.id == newest.id {
				pos.Next[s.part] = max(pos.Next[s.part], s.last+1)
			}
		}
		dead, err := w.deadSpans(ctx, newest.topic, newest.id)
		if err != nil {
			return err
		}
		for p, last := range dead {
			pos.Next[p] = max(pos.Next[p], last+1)
		}
		positions[t.topic] = pos
	}
	return w.saveOffsets(ctx, positions)
}

// deadSpans returns, per partition, the last offset of the era id of
// topic that the lake's dead letters hold.
func (w *Warehouse) deadSpans(ctx context.Context, topic, id string) (map[int32]int64, error) {
	parts, err := w.lake.Parts(filepath.Join(lake.DeadLetterDir, change.SafeName(topic)))
	if err != nil || len(parts) == 0 {
		return nil, err
	}
	files := make([]string, len(parts))
	for i, p := range parts {
		files[i] = w.lake.Abs(p.Path)
	}
	meta, err := w.lakeMetadata(ctx, files)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for i, p := range parts {
		if m := meta[files[i]]; m[metaTopic] == topic && m[metaTopicID] == id {
			out[p.Span.Partition] = max(out[p.Span.Partition], p.Span.Last)
		}
	}
	return out, nil
}
