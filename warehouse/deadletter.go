package warehouse

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// DeadLetter is an event that cannot be applied: not an envelope, a
// missing field, a value silver cannot hold, or a record of a topic with
// no schema. It is kept, raw, in lakeflow.dlq and the lake's _dlq
// directory, and the batch goes on without it.
type DeadLetter struct {
	Topic     string
	Partition int32
	Offset    int64
	Table     string
	Stage     string
	Reason    string
	Payload   []byte
}

const deadLetterTables = `
CREATE TABLE IF NOT EXISTS lakeflow.dlq (
	topic          VARCHAR NOT NULL,
	topic_id       VARCHAR NOT NULL,
	"partition"    INTEGER NOT NULL,
	"offset"       BIGINT NOT NULL,
	source_table   VARCHAR,
	failure_stage  VARCHAR NOT NULL,
	failure_reason VARCHAR NOT NULL,
	payload        BLOB,
	_cdc_seq       UBIGINT,
	_cdc_ord       UINTEGER,
	dead_at        TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (topic, topic_id, "partition", "offset")
);`

// schemaless adds the staged records of topics without a schema to the
// batch's dead letters.
func (w *Warehouse) schemaless(ctx context.Context) error {
	_, err := w.conn.ExecContext(ctx, `INSERT INTO lakeflow_dead
		SELECT topic, kafka_partition, kafka_offset, NULL, 'schema', 'no table schema for this topic in the schema topic', coalesce(raw, encode(v)), NULL, NULL
		FROM `+stageTable+` WHERE tbl = -1`)
	return err
}

// addDead adds dead letters known before the batch decodes (records of
// a meta topic another client wrote) to the batch's.
func (w *Warehouse) addDead(ctx context.Context, dead []DeadLetter) error {
	for _, d := range dead {
		if _, err := w.conn.ExecContext(ctx, "INSERT INTO lakeflow_dead VALUES (?, ?, ?, NULLIF(?, ''), ?, ?, ?, NULL, NULL)",
			d.Topic, d.Partition, d.Offset, d.Table, d.Stage, d.Reason, d.Payload); err != nil {
			return err
		}
	}
	return nil
}

// recordDead records dead letters outside a batch (inside the caller's
// transaction) as a batch does its own, and returns their staged lake
// files, to publish once the transaction has committed.
func (w *Warehouse) recordDead(ctx context.Context, dead []DeadLetter, positions map[string]TopicPosition) ([]lake.File, error) {
	if len(dead) == 0 {
		return nil, nil
	}
	if err := w.resetScratch(ctx, "lakeflow_dead"); err != nil {
		return nil, err
	}
	if err := w.addDead(ctx, dead); err != nil {
		return nil, err
	}
	if _, err := w.deadLetters(ctx, positions); err != nil {
		return nil, err
	}
	files, err := w.writeDeadLetters(ctx, len(dead), positions)
	if err == nil {
		err = w.lake.SyncStaging()
	}
	return files, err
}

// Dead reports whether lakeflow.dlq holds the record at offset of
// partition of topic already.
func (w *Warehouse) Dead(ctx context.Context, topic string, partition int32, offset int64) (bool, error) {
	var n int
	err := w.conn.QueryRowContext(ctx, `SELECT count(*) FROM lakeflow.dlq WHERE topic = ? AND "partition" = ? AND "offset" = ?`, topic, partition, offset).Scan(&n)
	return n > 0, err
}

// deadLetters records the batch's dead letters in lakeflow.dlq (a replayed
// batch adds nothing twice) and returns them.
func (w *Warehouse) deadLetters(ctx context.Context, positions map[string]TopicPosition) ([]DeadLetter, error) {
	rows, err := w.conn.QueryContext(ctx, `SELECT topic, "partition", "offset", coalesce(source_table, ''), failure_stage, failure_reason, payload FROM lakeflow_dead ORDER BY ALL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var d DeadLetter
		if err := rows.Scan(&d.Topic, &d.Partition, &d.Offset, &d.Table, &d.Stage, &d.Reason, &d.Payload); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil || len(out) == 0 {
		return out, err
	}
	var ids []string
	for topic, pos := range positions {
		ids = append(ids, fmt.Sprintf("(%s, %s)", literal(topic), literal(pos.ID)))
	}
	ids = append(ids, "(NULL, NULL)")
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT OR IGNORE INTO lakeflow.dlq
		SELECT d.topic, coalesce(i.id, ''), d."partition", d."offset", d.source_table, d.failure_stage, d.failure_reason, d.payload, d._cdc_seq, d._cdc_ord, now()
		FROM lakeflow_dead d LEFT JOIN (VALUES %s) AS i(topic, id) ON i.topic = d.topic`, strings.Join(ids, ", ")))
	return out, err
}

// writeDeadLetters keeps the batch's dead letters in the lake too, so the
// lake holds every record: _dlq/<topic>/date=<day they died>/, one file
// per topic partition, recorded in lakeflow.lake_files (source_table
// _dlq) like the tables' files, so a crash after the commit publishes it.
func (w *Warehouse) writeDeadLetters(ctx context.Context, n int, positions map[string]TopicPosition) ([]lake.File, error) {
	if n == 0 {
		return nil, nil
	}
	rows, err := w.conn.QueryContext(ctx, `SELECT topic, "partition", min("offset"), max("offset"), min(_cdc_seq), max(_cdc_seq), count(*) FROM lakeflow_dead GROUP BY ALL ORDER BY ALL`)
	if err != nil {
		return nil, err
	}
	type group struct {
		topic          string
		span           lake.Span
		minSeq, maxSeq *uint64
		n              int64
	}
	var groups []group
	for rows.Next() {
		var g group
		if err := rows.Scan(&g.topic, &g.span.Partition, &g.span.First, &g.span.Last, &g.minSeq, &g.maxSeq, &g.n); err != nil {
			rows.Close()
			return nil, err
		}
		if g.minSeq != nil {
			g.span.MinSeq, g.span.MaxSeq = change.LSN(*g.minSeq), change.LSN(*g.maxSeq)
		}
		groups = append(groups, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	day := time.Now().UTC().Format(time.DateOnly)
	var files []lake.File
	for _, g := range groups {
		f := w.lake.NewFile(filepath.Join(lake.DeadLetterDir, change.SafeName(g.topic)), day, g.span)
		files = append(files, f)
		_, err := w.conn.ExecContext(ctx, fmt.Sprintf(`COPY (SELECT *, now() AS dead_at FROM lakeflow_dead WHERE topic = %s AND "partition" = %d ORDER BY "offset")
			TO %s (FORMAT parquet, COMPRESSION zstd, KV_METADATA {%s: %s, %s: %s})`, literal(g.topic), g.span.Partition, literal(f.Staging),
			literal(metaTopic), literal(g.topic), literal(metaTopicID), literal(positions[g.topic].ID)))
		if err != nil {
			return files, err
		}
		if err := lake.Sync(f.Staging); err != nil {
			return files, err
		}
		fi, err := os.Stat(f.Staging)
		if err != nil {
			return files, err
		}
		var minSeq, maxSeq uint64
		if g.minSeq != nil {
			minSeq, maxSeq = *g.minSeq, *g.maxSeq
		}
		_, err = w.conn.ExecContext(ctx, "INSERT INTO lakeflow.lake_files VALUES (?, ?, ?::DATE, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
			f.Path, lake.DeadLetterDir, day, g.topic, g.span.Partition, g.span.First, g.span.Last, g.n,
			minSeq, maxSeq, fi.Size(), time.Now().UTC(), positions[g.topic].ID, w.batch+1)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}
