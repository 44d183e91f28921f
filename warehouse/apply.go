package warehouse

import (
	"context"
	"database/sql/driver"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/duckdb/duckdb-go/v2"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/lake"
)

// Record is one consumed Kafka record.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Value     []byte
}

// Batch is what one warehouse transaction applies.
type Batch struct {
	Records []Record
	// Positions are where the batch leaves every topic it read: the table
	// topics and the watermark topic.
	Positions map[string]TopicPosition
	// Watermark is set when the batch ends exactly at it: silver is then
	// the source as of Watermark.Seq, with no transaction in part.
	Watermark *change.Watermark
}

// BatchStats describes an applied batch and where its time went.
type BatchStats struct {
	Events    int
	LakeFiles int
	Tables    int
	Stage     time.Duration // appending the envelopes
	Decode    time.Duration // JSON to typed rows
	Lake      time.Duration // writing and syncing lake files
	Merge     time.Duration // silver
	Commit    time.Duration // commit and publish
}

// Apply applies a batch in one DuckDB transaction: it stages the records,
// writes each table's new events to lake files, merges them into silver
// and records the lake files, the positions and the batch. The lake files
// reach their final names only after the commit. A batch that fails
// leaves the warehouse as it was; applying it again is a no-op for what it
// already holds.
func (w *Warehouse) Apply(ctx context.Context, b Batch) (BatchStats, error) {
	var st BatchStats
	touched := map[*table]bool{}
	for _, r := range b.Records {
		t := w.byTopic[r.Topic]
		if t == nil {
			return st, fmt.Errorf("record from %s, which has no schema in the schema topic", r.Topic)
		}
		touched[t] = true
	}
	var files []lake.File
	var t0 time.Time
	err := w.inTx(ctx, func(ctx context.Context) error {
		var err error
		files, err = w.applyInTx(ctx, b, touched, &st)
		t0 = time.Now()
		return err
	})
	if err != nil {
		for _, f := range files {
			os.Remove(f.Staging) // lake.Recover would remove them too
		}
		return st, fmt.Errorf("batch: %w", err)
	}
	// Committed: from here a crash is rolled forward by lake.Recover.
	if err := w.lake.Publish(files); err != nil {
		return st, err
	}
	st.Commit = time.Since(t0)
	for _, r := range b.Records {
		w.raiseLakeHigh(r.Topic, r.Partition, r.Offset)
	}
	if b.Watermark != nil {
		w.floor = max(w.floor, b.Watermark.Seq)
		clear(w.known)
	}
	st.Events, st.LakeFiles, st.Tables = len(b.Records), len(files), len(touched)
	return st, nil
}

func (w *Warehouse) applyInTx(ctx context.Context, b Batch, touched map[*table]bool, st *BatchStats) ([]lake.File, error) {
	lap := time.Now()
	since := func() time.Duration {
		now := time.Now()
		d := now.Sub(lap)
		lap = now
		return d
	}
	if err := w.stage(ctx, b.Records); err != nil {
		return nil, err
	}
	st.Stage = since()
	order := make([]*table, 0, len(touched))
	for t := range touched {
		order = append(order, t)
	}
	slices.SortFunc(order, func(a, b *table) int { return a.id - b.id })
	var files []lake.File
	for _, t := range order {
		if _, err := w.conn.ExecContext(ctx, t.parse); err != nil {
			return files, fmt.Errorf("decode %s events: %w", t.schema.ID(), err)
		}
		var bad, keyOnly, stale int
		if err := w.conn.QueryRowContext(ctx, fmt.Sprintf(`SELECT
			count(*) FILTER (op IS NULL OR _cdc_seq IS NULL OR _cdc_ord IS NULL OR _commit_ts IS NULL
			                 OR (op <> 't' AND after IS NULL AND before IS NULL)),
			count(*) FILTER (key_only), count(*) FILTER (_cdc_seq <= %d)
			FROM lakeflow_rows`, w.floor)).Scan(&bad, &keyOnly, &stale); err != nil {
			return files, err
		}
		if bad > 0 {
			return files, fmt.Errorf("%s: %d events in this batch are not lakeflow envelopes", t.topic, bad)
		}
		if stale > 0 {
			// Events at or before the last consistent batch are applied and
			// in the lake already (the Kafka log was read again from its
			// start). (A filter in the parse would decode every envelope
			// twice.)
			if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("DELETE FROM lakeflow_rows WHERE _cdc_seq <= %d", w.floor)); err != nil {
				return files, err
			}
		}
		st.Decode += since()
		tf, err := w.writeLake(ctx, t, b.Positions[t.topic].ID)
		files = append(files, tf...)
		if err != nil {
			return files, fmt.Errorf("write lake files of %s: %w", t.schema.ID(), err)
		}
		st.Lake += since()
		apply := t.apply
		if keyOnly > 0 {
			apply = t.applyKeyOnly
		}
		for _, stmt := range apply {
			if _, err := w.conn.ExecContext(ctx, stmt); err != nil {
				return files, fmt.Errorf("apply %s batch: %w", t.schema.ID(), err)
			}
		}
		st.Merge += since()
	}
	if len(files) > 0 {
		if err := w.lake.SyncStaging(); err != nil {
			return files, err
		}
	}
	if err := w.saveOffsets(ctx, b.Positions); err != nil {
		return files, err
	}
	return files, w.recordBatch(ctx, b)
}

// recordBatch adds the batch to lakeflow.batches.
func (w *Warehouse) recordBatch(ctx context.Context, b Batch) error {
	lsn, end, commit := "NULL", "NULL", "NULL"
	if wm := b.Watermark; wm != nil {
		lsn, end = fmt.Sprint(uint64(wm.Seq)), fmt.Sprint(uint64(wm.End))
		if wm.Commit != 0 {
			commit = fmt.Sprintf("make_timestamptz(%d)", wm.Commit)
		}
	}
	_, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow.batches
		SELECT coalesce(max(batch), 0) + 1, %t, %s, %s, %s, %d, now() FROM lakeflow.batches`,
		b.Watermark != nil, lsn, end, commit, len(b.Records)))
	return err
}

// stage appends the raw envelopes to the TEMP staging table with the
// Appender (row-by-row INSERT is two orders of magnitude slower).
func (w *Warehouse) stage(ctx context.Context, recs []Record) error {
	if _, err := w.conn.ExecContext(ctx, "DELETE FROM lakeflow_stage"); err != nil {
		return err
	}
	if len(recs) == 0 {
		return nil
	}
	return w.conn.Raw(func(dc any) error {
		a, err := duckdb.NewAppender(dc.(driver.Conn), "temp", "main", "lakeflow_stage")
		if err != nil {
			return err
		}
		for _, r := range recs {
			if err := a.AppendRow(int32(w.byTopic[r.Topic].id), r.Partition, r.Offset, r.Value); err != nil {
				a.Close()
				return err
			}
		}
		return a.Close()
	})
}

// writeLake writes the table's events that are not in the lake yet, one
// file per commit day and Kafka partition, under staging names, and
// records them in lakeflow.lake_files.
func (w *Warehouse) writeLake(ctx context.Context, t *table, topicID string) ([]lake.File, error) {
	newer := "kafka_offset > " + w.lakeHighExpr(t.topic)
	if w.known[t] {
		newer += fmt.Sprintf(" AND NOT EXISTS (SELECT 1 FROM lakeflow_known k WHERE k.tbl = %d AND k.seq = lakeflow_rows._cdc_seq AND k.ord = lakeflow_rows._cdc_ord)", t.id)
	}
	rows, err := w.conn.QueryContext(ctx, fmt.Sprintf(`SELECT strftime(day, '%%Y-%%m-%%d'), kafka_partition, min(kafka_offset), max(kafka_offset),
		count(*), min(_cdc_seq), max(_cdc_seq) FROM lakeflow_rows WHERE %s GROUP BY ALL ORDER BY ALL`, newer))
	if err != nil {
		return nil, err
	}
	type group struct {
		day            string
		part           int32
		first, last, n int64
		minSeq, maxSeq uint64
	}
	var groups []group
	for rows.Next() {
		var g group
		if err := rows.Scan(&g.day, &g.part, &g.first, &g.last, &g.n, &g.minSeq, &g.maxSeq); err != nil {
			rows.Close()
			return nil, err
		}
		groups = append(groups, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var files []lake.File
	for _, g := range groups {
		f := w.lake.NewFile(lakeDir(t.schema), g.day, lake.Span{Partition: g.part, First: g.first, Last: g.last,
			MinSeq: change.LSN(g.minSeq), MaxSeq: change.LSN(g.maxSeq)})
		files = append(files, f)
		copySQL := fmt.Sprintf(`COPY (SELECT * EXCLUDE (day, key_only) FROM lakeflow_rows
			WHERE day = DATE %s AND kafka_partition = %d AND %s ORDER BY kafka_offset)
			TO %s (FORMAT parquet, COMPRESSION zstd)`, literal(g.day), g.part, newer, literal(f.Staging))
		if _, err := w.conn.ExecContext(ctx, copySQL); err != nil {
			return files, err
		}
		if err := lake.Sync(f.Staging); err != nil {
			return files, err
		}
		fi, err := os.Stat(f.Staging)
		if err != nil {
			return files, err
		}
		_, err = w.conn.ExecContext(ctx, "INSERT INTO lakeflow.lake_files VALUES (?, ?, ?::DATE, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
			f.Path, t.schema.ID(), g.day, t.topic, g.part, g.first, g.last, g.n, g.minSeq, g.maxSeq, fi.Size(), time.Now().UTC(), topicID)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}

// lakeHighExpr is the per-partition lake high offset as SQL (-1: none).
func (w *Warehouse) lakeHighExpr(topic string) string {
	high := w.lakeHigh[topic]
	if len(high) == 0 {
		return "-1"
	}
	var b strings.Builder
	b.WriteString("CASE kafka_partition")
	for p, off := range high {
		fmt.Fprintf(&b, " WHEN %d THEN %d", p, off)
	}
	b.WriteString(" ELSE -1 END")
	return b.String()
}

// LogReset tells the warehouse that the Kafka log of topic it read is gone
// and reading starts over in a new one, whose offsets say nothing about
// what the lake holds. Events at or before the last consistent batch are
// recognised by position (Apply drops them); events after it that a batch
// which was not consistent wrote are looked up in the lake.
func (w *Warehouse) LogReset(ctx context.Context, topic string) error {
	delete(w.lakeHigh, topic)
	t := w.byTopic[topic]
	if t == nil {
		return nil
	}
	rows, err := w.conn.QueryContext(ctx, "SELECT path FROM lakeflow.lake_files WHERE source_table = ? AND max_seq > ?", t.schema.ID(), uint64(w.floor))
	if err != nil {
		return err
	}
	var paths []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			rows.Close()
			return err
		}
		paths = append(paths, literal(w.lake.Abs(p)))
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(paths) == 0 {
		return err
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow_known SELECT %d, _cdc_seq, _cdc_ord
		FROM read_parquet([%s]) WHERE _cdc_seq > %d`, t.id, strings.Join(paths, ", "), w.floor))
	if err != nil {
		return fmt.Errorf("read the lake's events of %s after %s: %w", t.schema.ID(), w.floor, err)
	}
	w.known[t] = true
	return nil
}
