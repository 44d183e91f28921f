package warehouse

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/lake"
)

// The pieces of a warehouse rebuilt from the lake (lakeflow backfill):
// what the old warehouse knows of the pipeline's state is copied over;
// a warehouse that is lost is rebuilt from what the lake's files say of
// themselves.

// stateTables are the operations tables a rebuilt warehouse takes over
// from the one it replaces: where the pipeline stands (offsets, batches,
// source state), the lake's files and dead letters, the schema versions.
// The rest (silver, history, quarantine, gold) is computed again.
var stateTables = []string{"offsets", "batches", "source_state", "lake_files", "dlq", "schema_history"}

// CopyStateTo copies this warehouse's state tables into the warehouse
// file at path, which must have been created (Open) and hold none.
func (w *Warehouse) CopyStateTo(ctx context.Context, path string) error {
	if _, err := w.conn.ExecContext(ctx, "ATTACH "+literal(path)+" AS lakeflow_rebuild"); err != nil {
		return err
	}
	defer w.conn.ExecContext(context.WithoutCancel(ctx), "DETACH lakeflow_rebuild")
	return w.inTx(ctx, func(ctx context.Context) error {
		for _, t := range stateTables {
			stmts := []string{
				fmt.Sprintf("DELETE FROM lakeflow_rebuild.lakeflow.%s", t),
				fmt.Sprintf("INSERT INTO lakeflow_rebuild.lakeflow.%s SELECT * FROM lakeflow.%s", t, t),
			}
			if err := w.exec(ctx, stmts); err != nil {
				return fmt.Errorf("copy lakeflow.%s: %w", t, err)
			}
		}
		return nil
	})
}

// LakeSchemas reads, from the metadata of the lake's files, each table's
// newest schema and topic, and the position up to which the lake holds
// every event (its floor).
func (w *Warehouse) LakeSchemas(ctx context.Context) ([]Schema, change.LSN, error) {
	dirs, err := os.ReadDir(w.lake.Abs("."))
	if err != nil {
		return nil, 0, err
	}
	var newest []string
	for _, d := range dirs {
		if !d.IsDir() || strings.HasPrefix(d.Name(), "_") {
			continue
		}
		parts, err := w.lake.Parts(d.Name())
		if err != nil {
			return nil, 0, err
		}
		if len(parts) == 0 {
			continue
		}
		last := slices.MaxFunc(parts, func(a, b lake.Part) int { return cmp.Compare(a.Span.MaxSeq, b.Span.MaxSeq) })
		newest = append(newest, w.lake.Abs(last.Path))
	}
	if len(newest) == 0 {
		return nil, 0, nil
	}
	rows, err := w.conn.QueryContext(ctx, fmt.Sprintf("SELECT file_name, decode(key), decode(value) FROM parquet_kv_metadata(%s)", sqlList(newest)))
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	meta := map[string]map[string]string{}
	for rows.Next() {
		var file, k, v string
		if err := rows.Scan(&file, &k, &v); err != nil {
			return nil, 0, err
		}
		if meta[file] == nil {
			meta[file] = map[string]string{}
		}
		meta[file][k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	var out []Schema
	var floor change.LSN
	for _, file := range newest {
		m := meta[file]
		if m[metaSchema] == "" {
			return nil, 0, fmt.Errorf("lake file %s says nothing of its table (written before lakeflow kept a schema in each file): rebuild needs the old warehouse", file)
		}
		var t change.Table
		if err := json.Unmarshal([]byte(m[metaSchema]), &t); err != nil {
			return nil, 0, fmt.Errorf("lake file %s: schema: %w", file, err)
		}
		f, _ := strconv.ParseUint(m[metaFloor], 10, 64)
		floor = max(floor, change.LSN(f))
		out = append(out, Schema{Topic: m[metaTopic], Table: &t})
	}
	return out, floor, nil
}

// SetFloor records that the lake holds every event up to floor: a
// warehouse rebuilt without the old one's batches drops those events when
// Kafka sends them again.
func (w *Warehouse) SetFloor(ctx context.Context, floor change.LSN) error {
	if floor <= w.floor {
		return nil
	}
	_, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow.batches VALUES (%d, true, %d, %d, NULL, 0, now())`, w.batch+1, uint64(floor), uint64(floor)))
	if err == nil {
		w.batch++
		w.floor = floor
	}
	return err
}

// AdoptLakeFiles records in lakeflow.lake_files the lake files of the
// registered tables that it does not list (a warehouse rebuilt without
// the old one's list), and returns how many.
func (w *Warehouse) AdoptLakeFiles(ctx context.Context) (int, error) {
	listed := map[string]bool{}
	rows, err := w.conn.QueryContext(ctx, "SELECT path FROM lakeflow.lake_files")
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			rows.Close()
			return 0, err
		}
		listed[p] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	n := 0
	for _, t := range w.tables {
		parts, err := w.lake.Parts(lakeDir(t.schema))
		if err != nil {
			return n, err
		}
		for _, p := range parts {
			if listed[p.Path] {
				continue
			}
			fi, err := os.Stat(w.lake.Abs(p.Path))
			if err != nil {
				return n, err
			}
			_, err = w.conn.ExecContext(ctx, `INSERT INTO lakeflow.lake_files
				SELECT ?, ?, ?::DATE, ?, ?, ?, ?, count(*), ?, ?, ?, ?, NULL, NULL FROM read_parquet(?)`,
				p.Path, t.schema.ID(), p.Day, t.topic, p.Span.Partition, p.Span.First, p.Span.Last,
				uint64(p.Span.MinSeq), uint64(p.Span.MaxSeq), fi.Size(), time.Now().UTC(), w.lake.Abs(p.Path))
			if err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// ImportDeadLetters fills lakeflow.dlq from the lake's dead letters (a
// warehouse rebuilt without the old one's).
func (w *Warehouse) ImportDeadLetters(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join(w.lake.Abs(deadLetterDir), "*", "date=*", "*.parquet"))
	if err != nil || len(files) == 0 {
		return err
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT OR IGNORE INTO lakeflow.dlq
		SELECT topic, '', "partition", "offset", source_table, failure_stage, failure_reason, payload, _cdc_seq, _cdc_ord, dead_at
		FROM read_parquet(%s, union_by_name = true)`, sqlList(files)))
	return err
}
