package warehouse

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// ReplayStats describes a replay of the lake.
type ReplayStats struct {
	Events, Chunks, Quarantined int
	// Files and Bytes are the lake files the replay read.
	Files int
	Bytes int64
}

// ReplayScope says what a replay of the lake applies.
type ReplayScope struct {
	// ChunkEvents is about how many events each transaction applies (0:
	// one transaction).
	ChunkEvents int
	// From, if set, is the position of the state checkpoint this
	// warehouse was loaded from (LoadCheckpoint): the transactions
	// committed at or before it are applied already, and the lake files
	// that hold none after it are not read.
	From change.LSN
	// Upto, if set, leaves out the transactions committed after it, in
	// one transaction; the lake files that cannot hold any of the others
	// (by the positions in their names) are not read.
	Upto *Bound
	// Tables, if set, are the only tables replayed (by source ID).
	Tables map[string]bool
	// Apply, if set, are the only tables of those applied to silver; the
	// others are read and judged for the rules of these (an existence rule
	// needs the changes of the table it references, judged), then dropped.
	Apply map[string]bool
	// Days, if set, are the commit days a backfill of days rebuilds: of a
	// table no existence rule references, only the keys those days
	// changed are applied, with all their history (a key's row, history
	// and judgement depend on its changes alone), and every truncate; a
	// table a rule references is applied whole, since rules judge against
	// all of it. What the backfill takes from the replay is those keys'.
	Days *DayRange
}

// Bound is a point of the log: every transaction committed at or before
// position Seq.
type Bound struct {
	Seq change.LSN
}

// admits says whether a lake file may hold a transaction at or before b.
func (b *Bound) admits(p lake.Part) bool { return b == nil || p.Span.MinSeq <= b.Seq }

// where is SQL over lake events keeping those of positions (lo, hi]
// at or before b.
func (b *Bound) where(lo, hi uint64) string {
	return fmt.Sprintf("_cdc_seq > %d AND _cdc_seq <= %d", lo, min(hi, b.last()))
}

// last is the last position b admits.
func (b *Bound) last() uint64 {
	if b == nil {
		return math.MaxUint64
	}
	return uint64(b.Seq)
}

// Replay applies the lake's events in scope to this warehouse, which
// holds none of them yet, through the stream's transforms (applyRows:
// rules and quarantine, history, merge, gold), in chunks that end at
// transaction boundaries, each in one transaction. Lake files are not
// written: they are the input.
func (w *Warehouse) Replay(ctx context.Context, scope ReplayScope) (ReplayStats, error) {
	// A replay judges whole transactions (its chunks end at their
	// boundaries), or what the lake holds of the last: it defers nothing.
	open := w.open
	w.open = 0
	defer func() { w.open = open }()
	var st ReplayStats
	files := map[*table][]string{}
	spans := map[*table][]lake.Span{}
	var all []string
	referenced := w.referenced()
	sliced := map[*table]bool{}
	renames, err := w.renameChains(ctx)
	if err != nil {
		return st, err
	}
	for _, t := range w.tables {
		if scope.Tables != nil && !scope.Tables[t.schema.ID()] {
			continue
		}
		parts, err := w.parts(lakeDir(t.schema))
		if err != nil {
			return st, err
		}
		if scope.Days != nil && !referenced[t.schema.ID()] {
			var changed, every []string
			for _, p := range parts {
				path := w.lake.Abs(p.Path)
				if p.Span.MaxSeq > scope.From {
					// (A key moved before the checkpoint has its state there.)
					every = append(every, path)
				}
				if scope.Days.holds(p.Day) {
					changed = append(changed, path)
				}
			}
			if len(changed) == 0 {
				continue // nothing of it to rebuild
			}
			if err := w.makeSliceKeys(ctx, t, changed, renames[t.schema.ID()]); err != nil {
				return st, err
			}
			if err := w.addMovedKeys(ctx, t, every, renames[t.schema.ID()]); err != nil {
				return st, err
			}
			sliced[t] = true
		}
		for _, p := range parts {
			if !scope.Upto.admits(p) || p.Span.MaxSeq <= scope.From {
				continue
			}
			path := w.lake.Abs(p.Path)
			fi, err := os.Stat(path)
			if err != nil {
				return st, err
			}
			st.Bytes += fi.Size()
			files[t] = append(files[t], path)
			spans[t] = append(spans[t], p.Span)
		}
		all = append(all, files[t]...)
	}
	st.Files = len(all)
	if len(all) == 0 {
		return st, nil
	}
	lo := uint64(scope.From)
	var bounds []uint64
	if scope.ChunkEvents > 0 {
		var err error
		if bounds, err = w.chunkBounds(ctx, all, scope.ChunkEvents, scope.Upto.where(lo, math.MaxUint64)); err != nil {
			return st, err
		}
	} else {
		bounds = []uint64{scope.Upto.last()}
	}
	order := make([]*table, 0, len(files))
	for t := range files {
		order = append(order, t)
	}
	slices.SortFunc(order, func(a, b *table) int { return a.id - b.id })
	started := map[*table]bool{}
	for _, hi := range bounds {
		var bs BatchStats
		since := laps()
		err := w.inTx(ctx, func(ctx context.Context) error {
			rows := map[*table]rowsInfo{}
			var touched []*table
			for _, t := range order {
				// The files whose positions (in their names) meet the
				// chunk's: a chunk reads its own, not every footer of the
				// lake.
				var in []string
				for i, sp := range spans[t] {
					if uint64(sp.MaxSeq) > lo && uint64(sp.MinSeq) <= hi {
						in = append(in, files[t][i])
					}
				}
				if len(in) == 0 {
					continue
				}
				n, info, err := w.loadRows(ctx, t, in, renames[t.schema.ID()], scope.Upto.where(lo, hi), replayOffsets, sliced[t])
				if err != nil {
					return fmt.Errorf("read the lake of %s: %w", t.schema.ID(), err)
				}
				if n > 0 {
					info.judgeOnly = scope.Apply != nil && !scope.Apply[t.schema.ID()]
					if !started[t] {
						// (A table's first chunk with rows, which, its
						// files pruned by position, need not be the first.)
						started[t] = true
						err = w.conn.QueryRowContext(ctx, "SELECT count(*) = 0 FROM silver."+ident(t.schema.Name)).Scan(&info.empty)
						if err != nil {
							return err
						}
					}
					touched = append(touched, t)
					rows[t] = info
					st.Events += n
				}
			}
			if err := w.resetScratch(ctx, "lakeflow_failures"); err != nil {
				return err
			}
			bs.Decode = since()
			return w.applyRows(ctx, touched, rows, &bs, since)
		})
		if err == nil {
			err = w.releaseScratch(ctx)
		}
		if err != nil {
			return st, err
		}
		w.log.Debug("lake replayed", "to_seq", hi, "read", bs.Decode.Round(time.Millisecond), "rules", bs.Rules.Round(time.Millisecond),
			"history", bs.History.Round(time.Millisecond), "merge", bs.Merge.Round(time.Millisecond), "gold", bs.Gold.Round(time.Millisecond),
			"commit", since().Round(time.Millisecond))
		st.Chunks++
		st.Quarantined += bs.Quarantined
		lo = hi
	}
	return st, nil
}

// chunkBounds splits the positions of the lake's events that where
// keeps into chunks of about n events that end at transaction
// boundaries: the last _cdc_seq of each chunk.
func (w *Warehouse) chunkBounds(ctx context.Context, files []string, n int, where string) ([]uint64, error) {
	var total int64
	if err := w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT sum(num_rows) FROM parquet_file_metadata(%s)", sqlList(files))).Scan(&total); err != nil {
		return nil, err
	}
	if total <= int64(n) {
		return []uint64{math.MaxUint64}, nil // one chunk: no need to read the positions
	}
	rows, err := w.conn.QueryContext(ctx, fmt.Sprintf(`SELECT _cdc_seq, sum(count(*)) OVER (ORDER BY _cdc_seq) AS upto
		FROM read_parquet(%s, union_by_name = true) WHERE %s GROUP BY _cdc_seq ORDER BY _cdc_seq`, sqlList(files), where))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var bounds []uint64
	next := int64(n)
	var seq uint64
	var upto int64
	for rows.Next() {
		if err := rows.Scan(&seq, &upto); err != nil {
			return nil, err
		}
		if upto >= next {
			bounds = append(bounds, seq)
			next = upto + int64(n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(bounds) == 0 || bounds[len(bounds)-1] != seq {
		bounds = append(bounds, seq)
	}
	return bounds, nil
}

// renameChains gives, per table and column, the names the column had
// before (from lakeflow.schema_history): lake files of that time hold it
// under them.
func (w *Warehouse) renameChains(ctx context.Context) (map[string]map[string][]string, error) {
	rows, err := w.conn.QueryContext(ctx, "SELECT source_table, schema::VARCHAR FROM lakeflow.schema_history ORDER BY source_table, since_seq, since_ord")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]map[string][]string{}
	for rows.Next() {
		var id, raw string
		if err := rows.Scan(&id, &raw); err != nil {
			return nil, err
		}
		var t change.Table
		if err := json.Unmarshal([]byte(raw), &t); err != nil {
			return nil, err
		}
		if out[id] == nil {
			out[id] = map[string][]string{}
		}
		// A version's renames are simultaneous: each extends the chain
		// its old name had before it.
		before := maps.Clone(out[id])
		for to, from := range t.Renames {
			out[id][to] = append([]string{from}, before[from]...)
		}
	}
	return out, rows.Err()
}

// loadRows fills the rows table of t with its lake events that where
// (SQL) keeps, with one image per change as rowsTable says (images of
// the current schema: a column renamed since is read under its old
// name), and reports how many there are, whether a delete holds only the
// key (a before image whose other columns are all NULL: the lake keeps no
// flag, and for a full image the key-only apply gives the same row) and
// how many truncates.
func (w *Warehouse) loadRows(ctx context.Context, t *table, files []string, renames map[string][]string, where, offsets string, sliced bool) (int, rowsInfo, error) {
	byFile, err := w.namesByFile(ctx, t.schema, files)
	if err != nil {
		return 0, rowsInfo{}, err
	}
	renamed := false
	for col, groups := range byFile {
		renamed = renamed || len(groups) > 1 || groups[0].name != col
	}
	src := fmt.Sprintf("read_parquet(%s, union_by_name = true)", sqlList(files))
	if renamed {
		src = fmt.Sprintf("read_parquet(%s, union_by_name = true, filename = true)", sqlList(files))
	}
	fields, err := w.structFields(ctx, src)
	if err != nil {
		return 0, rowsInfo{}, err
	}
	same, err := w.sameImages(ctx, t, src)
	if err != nil {
		return 0, rowsInfo{}, err
	}
	// field is the files' field spelled name (names that differ in case
	// alone are one field of the files united).
	spelled := map[string]string{}
	for f := range fields {
		spelled[strings.ToLower(f)] = f
	}
	field := func(name string) (string, bool) {
		f, ok := spelled[strings.ToLower(name)]
		return f, ok && name != ""
	}
	image := func(side string) string {
		if same && !renamed {
			return side // the files have the current schema's images
		}
		cols := imageColumns(t.schema)
		vals := make([]string, len(cols))
		for i, c := range cols {
			typ := lakeType(c.Type)
			// A name other than the column's own counts as what converts
			// (a retype since may have left values that do not).
			value := func(name string) string {
				f, ok := field(name)
				switch {
				case !ok:
					return "NULL"
				case strings.EqualFold(name, c.Name):
					return fmt.Sprintf("CAST(%s.%s AS %s)", side, ident(f), typ)
				}
				return fmt.Sprintf("TRY_CAST(%s.%s AS %s)", side, ident(f), typ)
			}
			var v string
			if groups, ok := byFile[c.Name]; ok {
				// Each file holds the column under the name it had when
				// the file was written.
				v = value(groups[len(groups)-1].name)
				if len(groups) > 1 {
					var b strings.Builder
					b.WriteString("CASE")
					for _, g := range groups[:len(groups)-1] {
						fmt.Fprintf(&b, " WHEN list_contains(%s, filename) THEN %s", sqlList(g.files), value(g.name))
					}
					v = b.String() + " ELSE " + v + " END"
				}
			} else {
				// A warehouse that does not know when the column had its
				// former names: the first of them a change holds.
				have := []string{value(c.Name)}
				for _, n := range renames[c.Name] {
					have = append(have, value(n))
				}
				v = "coalesce(" + strings.Join(have, ", ") + ")"
			}
			vals[i] = fmt.Sprintf("%s := CAST(%s AS %s)", ident(c.Name), v, typ)
		}
		return fmt.Sprintf("CASE WHEN %s IS NULL THEN NULL ELSE struct_pack(%s) END", side, strings.Join(vals, ", "))
	}
	// (The columns the stream's decode gives for the lake and dead
	// letters alone, lsn, tx_id and kafka_topic, are left out: a fifth
	// less to copy.)
	// Files whose events left no TOASTed value unchanged have no such
	// column.
	unchanged := "CAST(NULL AS VARCHAR[])"
	if fields, err := w.columns(ctx, src); err != nil {
		return 0, rowsInfo{}, err
	} else if fields["unchanged"] {
		unchanged = "unchanged"
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE TEMP TABLE %s AS
SELECT op, coalesce(%s, %s) AS after, _cdc_seq, _cdc_ord, _commit_ts, kafka_partition, %s AS kafka_offset, %s AS unchanged
FROM %s WHERE %s`, rowsTable(t.id), image("after"), image("before"), offsets, unchanged, src, where))
	if err != nil {
		return 0, rowsInfo{}, err
	}
	var marks int
	if err := w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE op = 'm'", rowsTable(t.id))).Scan(&marks); err != nil {
		return 0, rowsInfo{}, err
	}
	if marks > 0 {
		from := fmt.Sprintf("(SELECT op, lsn, _cdc_seq, _cdc_ord FROM %s WHERE %s)", src, where)
		if err := w.reconcile(ctx, t, from); err != nil {
			return 0, rowsInfo{}, fmt.Errorf("reconcile %s with its copy: %w", t.schema.ID(), err)
		}
	} else if sliced {
		// Of a backfill's slice (ReplayScope.Days), the keys it holds;
		// a part whose copy is reconciled keeps every key, as the
		// reconciliation reads them all.
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("DELETE FROM %s WHERE op <> 't' AND NOT %s", rowsTable(t.id), sliceKeys(t, "after."))); err != nil {
			return 0, rowsInfo{}, err
		}
	}
	var nonKey []string
	for _, c := range t.schema.Columns {
		if !c.Key {
			nonKey = append(nonKey, "after."+ident(c.Name)+" IS NULL")
		}
	}
	keyOnly := "false"
	if len(nonKey) > 0 {
		keyOnly = "op = 'd' AND " + strings.Join(nonKey, " AND ")
	}
	var n, ko int
	var info rowsInfo
	err = w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*), count(*) FILTER (%s), count(*) FILTER (op = 't'), count(unchanged) > 0 FROM %s", keyOnly, rowsTable(t.id))).
		Scan(&n, &ko, &info.truncates, &info.unchanged)
	info.keyOnly = ko > 0
	return n, info, err
}

// replayOffsets numbers a replay's events for its rules, which tell
// changes apart by partition and offset: a lake that spans a reset Kafka
// log holds two events at one offset. (A batch that reads back the
// changes deferred before it keeps their offsets, which lakeflow.deferred
// names.)
const replayOffsets = "row_number() OVER ()"

// sameImages reports whether the images of a lake relation have the
// type the current schema of t gives them.
func (w *Warehouse) sameImages(ctx context.Context, t *table, src string) (bool, error) {
	cols := imageColumns(t.schema)
	fields := make([]string, len(cols))
	for i, c := range cols {
		fields[i] = fmt.Sprintf("%s := CAST(NULL AS %s)", ident(c.Name), lakeType(c.Type))
	}
	var want, have string
	err := w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT typeof(struct_pack(%s)), (SELECT typeof(after) FROM %s LIMIT 1)",
		strings.Join(fields, ", "), src)).Scan(&want, &have)
	return want == have, err
}

// namedFiles are lake files that hold a column under one name.
type namedFiles struct {
	name  string // "": the files do not hold the column
	files []string
}

// namesByFile gives, for each column of t with former names, the names
// files hold it under: the name it had under the schema the file was
// written with (each file's metadata names it). A file written after a
// rename holds the changes from before it under the new name; one written
// before holds them under the old, and may hold another column under the
// new (one dropped, which silver keeps under a name of its own since, or
// one renamed away).
func (w *Warehouse) namesByFile(ctx context.Context, t *change.Table, files []string) (map[string][]namedFiles, error) {
	formers := map[string][]change.Former{}
	for _, c := range imageColumns(t) {
		if f := formerNames(t, c.Name); len(f) > 0 {
			formers[c.Name] = f
		}
	}
	if len(formers) == 0 {
		return nil, nil
	}
	meta, err := w.lakeMetadata(ctx, files)
	if err != nil {
		return nil, err
	}
	out := map[string][]namedFiles{}
	for _, file := range files {
		var written struct {
			Since change.Position `json:"since"`
		}
		if err := json.Unmarshal([]byte(meta[file][metaSchema]), &written); err != nil {
			return nil, fmt.Errorf("lake file %s: schema: %w", file, err)
		}
		for col, fs := range formers {
			name := col
			if i := slices.IndexFunc(fs, func(f change.Former) bool { return written.Since.Less(f.Before) }); i >= 0 {
				name = fs[i].Name
			}
			groups := out[col]
			if j := slices.IndexFunc(groups, func(g namedFiles) bool { return g.name == name }); j >= 0 {
				groups[j].files = append(groups[j].files, file)
			} else {
				out[col] = append(groups, namedFiles{name: name, files: []string{file}})
			}
		}
	}
	return out, nil
}

// columns lists the columns of a lake relation (its files', united by
// name).
func (w *Warehouse) columns(ctx context.Context, src string) (map[string]bool, error) {
	return w.stringSet(ctx, "SELECT column_name FROM (DESCRIBE SELECT * FROM "+src+")")
}

// stringSet runs a query of one text column and returns its values.
func (w *Warehouse) stringSet(ctx context.Context, q string, args ...any) (map[string]bool, error) {
	rows, err := w.conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out[n] = true
	}
	return out, rows.Err()
}

// structFields lists the fields of the images of a lake relation (its
// files' fields, united by name).
func (w *Warehouse) structFields(ctx context.Context, src string) (map[string]bool, error) {
	return w.stringSet(ctx, "SELECT unnest(json_keys(to_json(x))) FROM (SELECT coalesce(after, before) AS x FROM "+src+
		" WHERE coalesce(after, before) IS NOT NULL LIMIT 1)")
}

// lakeType is the type the lake keeps a column's values in: silver's,
// except intervals, kept as their ISO 8601 text.
func lakeType(t change.Type) string {
	ct := duckType(t)
	if ct.toSilver == nil {
		return ct.duck
	}
	return strings.ReplaceAll(ct.duck, "INTERVAL", "VARCHAR")
}

// sqlList is a SQL list of string literals.
func sqlList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = literal(x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
