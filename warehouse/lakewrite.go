package warehouse

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// lakeFile is a lake file of a batch, written under its staging name, and
// what lakeflow.lake_files records of it in the batch's transaction.
type lakeFile struct {
	lake.File
	table          *table
	topicID        string
	day            string
	part           int32
	first, last, n int64
	minSeq, maxSeq uint64
	size           int64
	// topic and batch, of a merged file (Compact): the topic era its rows
	// came from, its newest batch.
	topic string
	batch int64
}

// writeLake writes the table's events that are not in the lake yet, one
// file per commit day and Kafka partition, under staging names, for
// recordLakeFiles to record once the batch's transaction runs (the files
// are published only after it commits). Each file carries, as Parquet
// key-value metadata, what a warehouse rebuilt from the lake alone needs:
// the table's schema and topic, the source position up to which the lake
// holds every event once the batch commits (floor), and the batch, with,
// if it ends at a watermark, the source position it leaves silver at, so
// lakeflow asof can name it without the warehouse.
func (w *Warehouse) writeLake(ctx context.Context, t *table, topicID string, floor change.LSN, wm *change.Watermark) ([]lakeFile, error) {
	src := decodedTable(t.id)
	newer := "kafka_offset > " + w.lakeHighExpr(t.topic)
	rows, err := w.laker.QueryContext(ctx, fmt.Sprintf(`SELECT strftime(day, '%%Y-%%m-%%d'), kafka_partition, min(kafka_offset), max(kafka_offset),
		count(*), min(_cdc_seq), max(_cdc_seq), count(unchanged) > 0 FROM %s WHERE %s GROUP BY ALL ORDER BY ALL`, src, newer))
	if err != nil {
		return nil, err
	}
	type group struct {
		day            string
		part           int32
		first, last, n int64
		minSeq, maxSeq uint64
		unchanged      bool
	}
	var groups []group
	for rows.Next() {
		var g group
		if err := rows.Scan(&g.day, &g.part, &g.first, &g.last, &g.n, &g.minSeq, &g.maxSeq, &g.unchanged); err != nil {
			rows.Close()
			return nil, err
		}
		groups = append(groups, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	schema, err := json.Marshal(t.schema)
	if err != nil {
		return nil, err
	}
	meta := fmt.Sprintf("%s: %s, %s: %s, %s: %s, %s: '%d'", literal(metaSchema), literal(string(schema)), literal(metaTopic), literal(t.topic),
		literal(metaTopicID), literal(topicID), literal(metaFloor), uint64(floor))
	bp := BatchPosition{Batch: w.batch + 1}
	if wm != nil {
		bp.Seq, bp.Commit = wm.Seq, commitTime(wm.Commit)
	}
	b, err := json.Marshal(bp)
	if err != nil {
		return nil, err
	}
	meta += ", " + literal(metaBatch) + ": " + literal(string(b))
	meta = "{" + meta + "}"
	var files []lakeFile
	for _, g := range groups {
		f := lakeFile{File: w.lake.NewFile(lakeDir(t.schema), g.day, lake.Span{Partition: g.part, First: g.first, Last: g.last,
			MinSeq: change.LSN(g.minSeq), MaxSeq: change.LSN(g.maxSeq)}),
			table: t, topicID: topicID, day: g.day, part: g.part, first: g.first, last: g.last, n: g.n, minSeq: g.minSeq, maxSeq: g.maxSeq}
		files = append(files, f)
		// Only files with TOASTed values left unchanged say which.
		exclude := "day, key_only, dlq_reason, unchanged"
		if g.unchanged {
			exclude = "day, key_only, dlq_reason"
		}
		copySQL := fmt.Sprintf(`COPY (SELECT * EXCLUDE (%s) FROM %s
			WHERE day = DATE %s AND kafka_partition = %d AND %s ORDER BY kafka_offset)
			TO %s (FORMAT parquet, COMPRESSION zstd, KV_METADATA %s)`, exclude, src, literal(g.day), g.part, newer, literal(f.Staging), meta)
		if _, err := w.laker.ExecContext(ctx, copySQL); err != nil {
			return files, err
		}
		if err := lake.Sync(f.Staging); err != nil {
			return files, err
		}
		fi, err := os.Stat(f.Staging)
		if err != nil {
			return files, err
		}
		files[len(files)-1].size = fi.Size()
	}
	return files, nil
}

// recordLakeFiles records a batch's lake files (writeLake) in
// lakeflow.lake_files, in one statement: it is on the batch's way to its
// commit, and a statement costs its planning whatever its size.
func (w *Warehouse) recordLakeFiles(ctx context.Context, files []lakeFile) error {
	if len(files) == 0 {
		return nil
	}
	rows := make([]string, len(files))
	var args []any
	now := time.Now().UTC()
	for i, f := range files {
		rows[i] = "(?, ?, ?::DATE, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
		args = append(args, f.Path, f.table.schema.ID(), f.day, f.table.topic, f.part, f.first, f.last, f.n, f.minSeq, f.maxSeq, f.size, now, f.topicID, w.batch+1)
	}
	_, err := w.conn.ExecContext(ctx, "INSERT INTO lakeflow.lake_files VALUES "+strings.Join(rows, ", "), args...)
	return err
}

// The key-value metadata of a lake file.
const (
	metaSchema = "lakeflow.schema"
	metaTopic  = "lakeflow.topic"
	// metaTopicID is the Kafka topic's ID: offsets count within one era
	// of a topic (deleted and made again, its offsets start over).
	metaTopicID = "lakeflow.topic_id"
	metaFloor   = "lakeflow.floor"
	metaBatch   = "lakeflow.batch"
	// metaBatches, in a merged file, names the file beside it that lists
	// every consistent batch of the files it replaced (lake.BatchesFile;
	// metaBatch is the newest of them all).
	metaBatches = "lakeflow.batches"
)

// BatchPosition is a batch the pipeline committed and, if it ended at a
// watermark, the source position (a consistent LSN) silver was at then
// and the commit time of the source transaction there (zero: unknown).
type BatchPosition struct {
	Batch  int64      `json:"batch"`
	Seq    change.LSN `json:"seq,omitempty"`
	Commit time.Time  `json:"commit,omitzero"`
}

// commitTime is a commit time in µs since the epoch as a time (zero if 0:
// unknown).
func commitTime(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
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
