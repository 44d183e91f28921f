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
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// The pieces of a warehouse rebuilt from the lake (lakeflow backfill):
// what the old warehouse knows of the pipeline's state is copied over;
// a warehouse that is lost is rebuilt from what the lake's files say of
// themselves.

// stateTables are the operations tables a rebuilt warehouse takes over
// from the one it replaces: where the pipeline stands (offsets, batches,
// source state), the lake's files and dead letters, the schema versions.
// The rest (silver, history, quarantine, gold) is computed again.
var stateTables = []string{"offsets", "batches", "source_state", "lake_files", "dlq", "schema_history", "compactions"}

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

// LakeState is what the lake's files say of themselves: every version of
// each table's schema with its topic, in the order they took effect; the
// position up to which the lake holds every event (its floor); and the
// last batch a file names.
type LakeState struct {
	Schemas []Schema
	Floor   change.LSN
	Batch   int64
}

// Newest is each table's newest schema, in the order tables first appear.
func (ls LakeState) Newest() []Schema {
	var out []Schema
	at := map[string]int{}
	for _, s := range ls.Schemas {
		if i, ok := at[s.Table.ID()]; ok {
			out[i] = s
			continue
		}
		at[s.Table.ID()] = len(out)
		out = append(out, s)
	}
	return out
}

// ReadLakeState reads the lake's state from the metadata of all its
// files (a schema's renames are only in the version that made them).
func (w *Warehouse) ReadLakeState(ctx context.Context) (LakeState, error) {
	var st LakeState
	parts, err := w.allParts()
	if err != nil {
		return st, err
	}
	files := make([]string, len(parts))
	for i, p := range parts {
		files[i] = w.lake.Abs(p.Path)
	}
	meta, err := w.lakeMetadata(ctx, files)
	if err != nil {
		return st, err
	}
	type version struct {
		since change.Position
		id    string
		s     Schema
	}
	seen := map[string]bool{}
	var versions []version
	for _, file := range files {
		m := meta[file]
		if m[metaSchema] == "" {
			return st, fmt.Errorf("%w: lake file %s carries no table schema (a lakeflow older than the schema in each file wrote it): only the warehouse that lists it can read it",
				fault.ErrConfig, file)
		}
		f, _ := strconv.ParseUint(m[metaFloor], 10, 64)
		st.Floor = max(st.Floor, change.LSN(f))
		if b, ok := batchPosition(m); ok {
			st.Batch = max(st.Batch, b.Batch)
		}
		if seen[m[metaTopic]+"\x00"+m[metaSchema]] {
			continue
		}
		seen[m[metaTopic]+"\x00"+m[metaSchema]] = true
		var t change.Table
		if err := json.Unmarshal([]byte(m[metaSchema]), &t); err != nil {
			return st, fmt.Errorf("lake file %s: schema: %w", file, err)
		}
		versions = append(versions, version{since: t.Since, id: t.ID(), s: Schema{Topic: m[metaTopic], Table: &t}})
	}
	slices.SortStableFunc(versions, func(a, b version) int {
		if c := cmp.Compare(a.id, b.id); c != 0 {
			return c
		}
		if a.since.Less(b.since) {
			return -1
		}
		if b.since.Less(a.since) {
			return 1
		}
		return 0
	})
	for _, v := range versions {
		st.Schemas = append(st.Schemas, v.s)
	}
	return st, nil
}

// lakeMetadata reads the key-value metadata of lake files.
func (w *Warehouse) lakeMetadata(ctx context.Context, files []string) (map[string]map[string]string, error) {
	meta := map[string]map[string]string{}
	if len(files) == 0 {
		return meta, nil
	}
	rows, err := w.conn.QueryContext(ctx, fmt.Sprintf("SELECT file_name, decode(key), decode(value) FROM parquet_kv_metadata(%s)", sqlList(files)))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var file, k, v string
		if err := rows.Scan(&file, &k, &v); err != nil {
			return nil, err
		}
		if meta[file] == nil {
			meta[file] = map[string]string{}
		}
		meta[file][k] = v
	}
	return meta, rows.Err()
}

// batchPosition is the batch a lake file's metadata names, if any (the
// newest, for a compacted file).
func batchPosition(meta map[string]string) (BatchPosition, bool) {
	var b BatchPosition
	if meta[metaBatch] == "" || json.Unmarshal([]byte(meta[metaBatch]), &b) != nil {
		return b, false
	}
	return b, true
}

// SetFloor records that the lake holds every event up to floor: a
// warehouse rebuilt without the old one's batches drops those events when
// Kafka sends them again. Its batches are numbered after last, the last
// the lake's files name, so a name stays with one position.
func (w *Warehouse) SetFloor(ctx context.Context, floor change.LSN, last int64) error {
	if floor <= w.floor {
		return nil
	}
	batch := max(w.batch, last) + 1
	_, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow.batches VALUES (%d, true, %d, %d, NULL, 0, now())`, batch, uint64(floor), uint64(floor)))
	if err == nil {
		w.batch = batch
		w.floor = floor
	}
	return err
}

// NumberAfterLake makes a warehouse that has committed no batch yet
// number its batches after the last one the lake's files name (a lost
// warehouse rebuilt from Kafka by lakeflow run), so a name stays with one
// position (lakeflow asof batch:N).
func (w *Warehouse) NumberAfterLake(ctx context.Context) error {
	if w.batch > 0 {
		return nil
	}
	ls, err := w.ReadLakeState(ctx)
	if err != nil {
		return err
	}
	w.batch = ls.Batch
	return nil
}

// AdoptLakeFiles records in lakeflow.lake_files the lake files of the
// registered tables that it does not list (a warehouse rebuilt without
// the old one's list), and returns how many.
func (w *Warehouse) AdoptLakeFiles(ctx context.Context) (int, error) {
	listed, err := w.stringSet(ctx, "SELECT path FROM lakeflow.lake_files")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, t := range w.tables {
		parts, err := w.lake.Parts(lakeDir(t.schema))
		if err != nil {
			return n, err
		}
		var files []string
		for _, p := range parts {
			if !listed[p.Path] {
				files = append(files, w.lake.Abs(p.Path))
			}
		}
		// Each file says the era of the Kafka log that wrote it.
		meta, err := w.lakeMetadata(ctx, files)
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
			m := meta[w.lake.Abs(p.Path)]
			_, err = w.conn.ExecContext(ctx, `INSERT INTO lakeflow.lake_files
				SELECT ?, ?, ?::DATE, ?, ?, ?, ?, count(*), ?, ?, ?, ?, NULLIF(?, ''), NULL FROM read_parquet(?)`,
				p.Path, t.schema.ID(), p.Day, cmp.Or(m[metaTopic], t.topic), p.Span.Partition, p.Span.First, p.Span.Last,
				uint64(p.Span.MinSeq), uint64(p.Span.MaxSeq), fi.Size(), time.Now().UTC(), m[metaTopicID], w.lake.Abs(p.Path))
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
	files, err := filepath.Glob(filepath.Join(w.lake.Abs(lake.DeadLetterDir), "*", "date=*", "*.parquet"))
	if err != nil || len(files) == 0 {
		return err
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT OR IGNORE INTO lakeflow.dlq
		SELECT topic, '', "partition", "offset", source_table, failure_stage, failure_reason, payload, _cdc_seq, _cdc_ord, dead_at
		FROM read_parquet(%s, union_by_name = true)`, sqlList(files)))
	return err
}
