package warehouse

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// CompactOptions say what Compact merges.
type CompactOptions struct {
	// Table, if set, is the only table compacted (a source ID).
	Table string
	// Before: only commit days before it (YYYY-MM-DD) are compacted.
	Before string
	// Target is the size a merged file grows to before the next begins.
	Target int64
	// Grace is how long the files a compaction replaced stay (for
	// readers that listed them before) before they are removed.
	Grace time.Duration
	// MaxDays and MaxBytes, if set, bound how many table-days one call
	// compacts and how many bytes of files it merges (a running
	// pipeline's pass, between two batches); what is left is the next
	// call's (More).
	MaxDays  int
	MaxBytes int64
	// After, if set, is the table (source ID) the call before stopped
	// at: a bounded call begins with the tables after it, then wraps
	// round, so that a table that gets small files every batch cannot
	// take every pass while the others' wait (CompactStats.Last).
	After string
	// Incremental leaves today's (UTC) merged files as they are, so a
	// pass over today costs what came since the last (a running
	// pipeline's); the day's first pass after it ends merges them.
	Incremental bool
	// Wait for readers of the lake (lakeflow asof, check) to let go of
	// its files before a swap; without it, a day they hold is left for a
	// later call (More).
	Wait bool
}

// CompactStats is what Compact did.
type CompactStats struct {
	Days, Replaced, Written int
	Last                    string // the last table whose day it merged
	Removed                 int    // old days removed after their grace period
	More                    bool   // a bound stopped it with files left to merge
}

// Compact merges, for each table and commit day before opts.Before, the
// lake files that one Kafka partition of one topic era wrote under one
// schema, consecutive ones into a file of up to opts.Target bytes, rows
// in (_cdc_seq, _cdc_ord) order, each with the metadata the files it
// replaces carried (schema, topic, positions and offsets in its name;
// the day's _batches lists every consistent batch they named). A day is
// built again beside the lake (the files left as they are linked into
// it), recorded in lakeflow.lake_files and lakeflow.compactions in one
// transaction, then exchanged with the day's directory in one rename.
// Only files of batches up to the last consistent one are merged.
func (w *Warehouse) Compact(ctx context.Context, opts CompactOptions) (CompactStats, error) {
	var st CompactStats
	var err error
	if st.Removed, err = w.RemoveCompacted(ctx, opts.Grace); err != nil {
		return st, err
	}
	var newest int64
	if err := w.conn.QueryRowContext(ctx, "SELECT coalesce(max(batch) FILTER (consistent), 0) FROM lakeflow.batches").Scan(&newest); err != nil {
		return st, err
	}
	ids := make([]string, 0, len(w.tables))
	for id := range w.tables {
		if opts.Table == "" || opts.Table == id {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if k, found := slices.BinarySearch(ids, opts.After); opts.After != "" {
		if found {
			k++
		}
		ids = append(ids[k:], ids[:k]...)
	}
	budget := opts.MaxBytes
	today := time.Now().UTC().Format(time.DateOnly)
	for _, id := range ids {
		t := w.tables[id]
		dir := lakeDir(t.schema)
		days, err := w.lake.Days(dir)
		if err != nil {
			return st, err
		}
		for _, day := range days {
			if day >= opts.Before {
				continue
			}
			if opts.MaxDays > 0 && st.Days >= opts.MaxDays {
				st.More = true
				return st, nil
			}
			done, err := w.compactDay(ctx, t, dir, day, dayPlan{newest: newest, target: opts.Target, today: opts.Incremental && day >= today, budget: budget, wait: opts.Wait})
			if errors.Is(err, lake.ErrReadersHold) {
				st.More = true
				return st, nil
			}
			if err != nil {
				return st, fmt.Errorf("compact %s, %s: %w", id, day, err)
			}
			if done.written > 0 {
				st.Last = id
				st.Days++
				st.Replaced += done.replaced
				st.Written += done.written
			}
			if opts.MaxBytes > 0 {
				if budget -= done.bytes; done.left || budget <= 0 {
					st.More = true
					return st, nil
				}
			}
		}
	}
	return st, nil
}

// dayPlan is how compactDay merges a day: newest is the last consistent
// batch, target the size a merged file grows to, budget (if > 0) the
// bytes of files it merges at most; today leaves the day's merged files
// as they are (CompactOptions.Incremental).
type dayPlan struct {
	newest, target, budget int64
	today, wait            bool
}

// dayDone is what compactDay did: files replaced and written, bytes of
// files merged, and whether the budget left files to merge.
type dayDone struct {
	replaced, written int
	bytes             int64
	left              bool
}

// compactBin is consecutive files of one Kafka partition, topic era and
// schema that one merged file replaces.
type compactBin struct {
	files []lake.Part
	meta  map[string]string // the first file's
	bytes int64
}

// compactDay compacts one table's commit day. Without plan.wait it
// leaves the day as it is when readers of the lake hold its files
// (ErrReadersHold): the next pass tries again.
func (w *Warehouse) compactDay(ctx context.Context, t *table, dir, day string, plan dayPlan) (dayDone, error) {
	var done dayDone
	settled, err := w.settledFiles(ctx, t, day, plan.newest)
	if err != nil {
		return done, err
	}
	all, err := w.lake.Parts(dir)
	if err != nil {
		return done, err
	}
	parts := slices.DeleteFunc(all, func(p lake.Part) bool { return p.Day != day || !settled[p.Path] })
	if len(parts) < 2 {
		return done, nil
	}
	paths := make([]string, len(parts))
	for i, p := range parts {
		paths[i] = w.lake.Abs(p.Path)
	}
	meta, err := w.lakeMetadata(ctx, paths)
	if err != nil {
		return done, err
	}
	bins, err := w.binDay(parts, meta, plan)
	if err != nil || len(bins) == 0 {
		return done, err
	}
	for i, b := range bins {
		if plan.budget > 0 && done.bytes > 0 && done.bytes+b.bytes > plan.budget {
			bins, done.left = bins[:i], true // the rest: the next pass's
			break
		}
		done.bytes += b.bytes
	}
	if !plan.wait {
		// Readers hold the lake: the merge would be thrown away.
		unlock, err := w.lake.LockSwaps(false)
		if err != nil {
			return done, err
		}
		unlock()
	}
	var replaced []lake.Part
	for _, b := range bins {
		replaced = append(replaced, b.files...)
	}
	rb := make([]byte, 8)
	rand.Read(rb)
	id := fmt.Sprintf("%s~%s~%s", dir, day, hex.EncodeToString(rb))
	built := w.lake.CompactDir(id)
	recorded := false
	defer func() {
		if !recorded {
			w.lake.RemoveCompaction(id) // the lake and lake_files are as they were
		}
	}()
	if err := os.MkdirAll(built, 0o755); err != nil {
		return done, err
	}
	// Everything of the day that is not merged, settled or not, listed in
	// lake_files or not, is in the day built again as it is.
	left, err := w.dayLeft(dir, day, replaced)
	if err != nil {
		return done, err
	}
	for _, name := range left {
		if err := os.Link(filepath.Join(w.lake.DayDir(dir, day), name), filepath.Join(built, name)); err != nil {
			return done, err
		}
	}
	var written []lakeFile
	for _, b := range bins {
		f, err := w.mergeBin(ctx, t, dir, day, built, b)
		if err != nil {
			return done, err
		}
		written = append(written, f)
	}
	if err := w.writeDayBatches(ctx, dir, day, built, replaced, meta); err != nil {
		return done, err
	}
	if err := w.lake.SyncBuilt(id); err != nil {
		return done, err
	}
	unlock, err := w.lake.LockSwaps(plan.wait)
	if err != nil {
		return done, err
	}
	defer unlock()
	// Nothing came into the day meanwhile (only this process writes the
	// lake, between these steps): were it otherwise, the swap would hide it.
	if now, err := w.dayLeft(dir, day, replaced); err != nil {
		return done, err
	} else if !slices.Equal(now, left) {
		return done, fmt.Errorf("the day's files changed while it was compacted (%d left as they were, now %d)", len(left), len(now))
	}
	names := make([]string, 0, len(written))
	for _, f := range written {
		names = append(names, filepath.Base(f.Path))
	}
	err = w.inTx(ctx, func(ctx context.Context) error {
		gone := make([]string, len(replaced))
		for i, p := range replaced {
			gone[i] = literal(p.Path)
		}
		if _, err := w.conn.ExecContext(ctx, "DELETE FROM lakeflow.lake_files WHERE path IN ("+strings.Join(gone, ", ")+")"); err != nil {
			return err
		}
		if err := w.recordCompacted(ctx, written); err != nil {
			return err
		}
		_, err := w.conn.ExecContext(ctx, fmt.Sprintf("INSERT INTO lakeflow.compactions VALUES (%s, %s, DATE %s, %s::VARCHAR[], %d, now(), NULL)",
			literal(id), literal(t.schema.ID()), literal(day), sqlList(names), len(replaced)))
		return err
	})
	if err != nil {
		return done, err
	}
	recorded = true
	crash.Point(crash.CompactRecorded)
	if err := w.swapCompacted(ctx, dir, day, id); err != nil {
		return done, unfinished(err)
	}
	done.replaced, done.written = len(replaced), len(written)
	return done, nil
}

// ErrSwapUnfinished is the error of a compaction recorded in the
// warehouse and not exchanged into the lake: lakeflow.lake_files names
// the merged files, the day holds the old ones. Nothing may write the
// lake until the next start finishes it (recoverCompactions).
var ErrSwapUnfinished = errors.New("a compaction recorded in the warehouse is not swapped into the lake")

// unfinished is the stop of a swap that failed once recorded, in the
// environment's class (exit 3): only the lake's file system can refuse
// a rename within it, and once it lets it, the next lakeflow run (or
// compact) finishes the swap before anything else.
func unfinished(err error) error {
	return fmt.Errorf("%w: %w: %w (lakeflow run finishes it at its start once the lake's file system lets it rename there)", fault.ErrEnvironment, ErrSwapUnfinished, err)
}

// dayLeft lists the names in a table's day directory but the replaced
// files and the batch list (which a compaction writes again), sorted.
func (w *Warehouse) dayLeft(dir, day string, replaced []lake.Part) ([]string, error) {
	entries, err := os.ReadDir(w.lake.DayDir(dir, day))
	if err != nil {
		return nil, err
	}
	gone := map[string]bool{lake.BatchesFile: true}
	for _, p := range replaced {
		gone[filepath.Base(p.Path)] = true
	}
	var left []string
	for _, e := range entries {
		if !gone[e.Name()] {
			left = append(left, e.Name())
		}
	}
	return left, nil
}

// tierRun is how many of today's merged files of one tier (tierOf)
// following each other a running pipeline's pass merges into one of a
// higher tier: each pass writes a merged file of what came since the
// last, and merged again only in runs, a day keeps a few files per tier
// (about tierRun × log4 of the day's size in MiB, not a file per pass),
// and each byte is written again about once per tier, not once per pass.
const tierRun = 4

// tierOf is a merged file's tier: 1 up to 4 MiB, 2 up to 16 MiB, and
// so on.
func tierOf(size int64) int {
	t := 1
	for s := size >> 22; s > 0; s >>= 2 {
		t++
	}
	return t
}

// binDay packs a day's files into the bins merged files replace: files
// of one Kafka partition, topic era and schema, consecutive by position,
// up to the target size a bin. Files of half the target or more (an
// earlier pass's merged files among them) stay as they are, so a day
// converges, and so does every file alone in its bin. Today
// (plan.today), the files a compaction wrote are merged only with their
// own tier, tierRun or more in a row.
func (w *Warehouse) binDay(parts []lake.Part, meta map[string]map[string]string, plan dayPlan) ([]compactBin, error) {
	var bins []compactBin
	groups := map[string][]lake.Part{}
	var order []string
	sizes := map[string]int64{}
	tiers := map[string]int{} // 0: not a merged file of today
	for _, p := range parts {
		fi, err := os.Stat(w.lake.Abs(p.Path))
		if err != nil {
			return nil, err
		}
		m := meta[w.lake.Abs(p.Path)]
		if fi.Size() >= plan.target/2 {
			continue
		}
		if plan.today && m[metaBatches] != "" {
			tiers[p.Path] = tierOf(fi.Size())
		}
		sizes[p.Path] = fi.Size()
		key := strings.Join([]string{strconv.Itoa(int(p.Span.Partition)), m[metaTopic], m[metaTopicID], m[metaSchema]}, "\x00")
		if groups[key] == nil {
			order = append(order, key)
		}
		groups[key] = append(groups[key], p)
	}
	for _, key := range order {
		files := groups[key]
		slices.SortFunc(files, func(a, b lake.Part) int {
			return cmp.Or(cmp.Compare(a.Span.MinSeq, b.Span.MinSeq), cmp.Compare(a.Path, b.Path))
		})
		var bin compactBin
		tier := 0
		flush := func() {
			if len(bin.files) > 1 && (tier == 0 || len(bin.files) >= tierRun) {
				bins = append(bins, bin)
			}
			bin = compactBin{}
		}
		for _, p := range files {
			if len(bin.files) > 0 && (bin.bytes+sizes[p.Path] > plan.target || tiers[p.Path] != tier) {
				flush()
			}
			tier = tiers[p.Path]
			if bin.meta == nil {
				bin.meta = meta[w.lake.Abs(p.Path)]
			}
			bin.files = append(bin.files, p)
			bin.bytes += sizes[p.Path]
		}
		flush()
	}
	return bins, nil
}

// settledFiles are the lake files of a table's day that batches up to the
// last consistent one wrote (files of later batches hold part of a
// transaction the lake may not have the rest of yet), or that a rebuilt
// warehouse adopted.
func (w *Warehouse) settledFiles(ctx context.Context, t *table, day string, newest int64) (map[string]bool, error) {
	return w.stringSet(ctx, "SELECT path FROM lakeflow.lake_files WHERE source_table = ? AND day = ?::DATE AND coalesce(batch, 0) <= ?",
		t.schema.ID(), day, newest)
}

// writeDayBatches writes, into a day built for compaction, the list of
// every consistent batch that the files it replaced named (a merged file
// names only the newest): the day's list of an earlier compaction, and
// the batch of each file merged now.
func (w *Warehouse) writeDayBatches(ctx context.Context, dir, day, built string, replaced []lake.Part, meta map[string]map[string]string) error {
	const list = "lakeflow_compact_batches"
	if _, err := w.conn.ExecContext(ctx, "CREATE OR REPLACE TEMP TABLE "+list+" (batch BIGINT, seq UBIGINT, commit_ts TIMESTAMPTZ)"); err != nil {
		return err
	}
	defer w.conn.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+list)
	earlier := filepath.Join(w.lake.DayDir(dir, day), lake.BatchesFile)
	if _, err := os.Stat(earlier); err == nil {
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s SELECT batch, seq, commit_ts FROM read_parquet(%s)", list, literal(earlier))); err != nil {
			return err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var rows []string
	flush := func() error {
		if len(rows) == 0 {
			return nil
		}
		_, err := w.conn.ExecContext(ctx, "INSERT INTO "+list+" VALUES "+strings.Join(rows, ", "))
		rows = rows[:0]
		return err
	}
	for _, p := range replaced {
		b, ok := batchPosition(meta[w.lake.Abs(p.Path)])
		if !ok || b.Seq == 0 {
			continue // not a consistent batch
		}
		commit := "NULL"
		if !b.Commit.IsZero() {
			commit = fmt.Sprintf("make_timestamptz(%d)", b.Commit.UnixMicro())
		}
		rows = append(rows, fmt.Sprintf("(%d, %d, %s)", b.Batch, uint64(b.Seq), commit))
		if len(rows) == 1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	// A batch named twice (a lake an older lakeflow rebuilt numbered its
	// batches again): the newer position stands, as BatchPositions reads.
	path := filepath.Join(built, lake.BatchesFile)
	if _, err := w.conn.ExecContext(ctx, fmt.Sprintf(`COPY (SELECT batch, max(seq) AS seq, arg_max(commit_ts, seq) AS commit_ts FROM %s GROUP BY batch ORDER BY batch)
		TO %s (FORMAT parquet, COMPRESSION zstd)`, list, literal(path))); err != nil {
		return err
	}
	return lake.Sync(path)
}

// dayBatches reads the consistent batches a compacted day's list names.
func (w *Warehouse) dayBatches(ctx context.Context, dayDir string) ([]BatchPosition, error) {
	rows, err := w.conn.QueryContext(ctx, fmt.Sprintf("SELECT batch, seq, epoch_us(commit_ts) FROM read_parquet(%s)", literal(filepath.Join(dayDir, lake.BatchesFile))))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []BatchPosition
	for rows.Next() {
		var b BatchPosition
		var seq uint64
		var commit sql.NullInt64
		if err := rows.Scan(&b.Batch, &seq, &commit); err != nil {
			return nil, err
		}
		b.Seq, b.Commit = change.LSN(seq), commitTime(commit.Int64)
		out = append(out, b)
	}
	return out, rows.Err()
}

// mergeBin writes the file that replaces a bin's, into built.
func (w *Warehouse) mergeBin(ctx context.Context, t *table, dir, day, built string, b compactBin) (lakeFile, error) {
	src := make([]string, len(b.files))
	for i, p := range b.files {
		src[i] = w.lake.Abs(p.Path)
	}
	meta, err := w.lakeMetadata(ctx, src)
	if err != nil {
		return lakeFile{}, err
	}
	var floor uint64
	newest := BatchPosition{}
	s := b.files[0].Span
	for i, f := range src {
		fl, _ := strconv.ParseUint(meta[f][metaFloor], 10, 64)
		floor = max(floor, fl)
		if bp, ok := batchPosition(meta[f]); ok && bp.Batch > newest.Batch {
			newest = bp
		}
		p := b.files[i].Span
		s.First, s.Last, s.MinSeq, s.MaxSeq = min(s.First, p.First), max(s.Last, p.Last), min(s.MinSeq, p.MinSeq), max(s.MaxSeq, p.MaxSeq)
	}
	nb, err := json.Marshal(newest)
	if err != nil {
		return lakeFile{}, err
	}
	kv := fmt.Sprintf("{%s: %s, %s: %s, %s: %s, %s: '%d', %s: %s, %s: %s}",
		literal(metaSchema), literal(b.meta[metaSchema]), literal(metaTopic), literal(b.meta[metaTopic]), literal(metaTopicID), literal(b.meta[metaTopicID]),
		literal(metaFloor), floor, literal(metaBatch), literal(string(nb)), literal(metaBatches), literal(lake.BatchesFile))
	f := w.lake.NewFile(dir, day, s)
	path := filepath.Join(built, filepath.Base(f.Path))
	// (Not Hive partitioning: the day is in the path, not in the rows.)
	if _, err := w.conn.ExecContext(ctx, fmt.Sprintf(`COPY (SELECT * FROM read_parquet(%s, union_by_name = true, hive_partitioning = false) ORDER BY _cdc_seq, _cdc_ord, kafka_offset)
		TO %s (FORMAT parquet, COMPRESSION zstd, KV_METADATA %s)`, sqlList(src), literal(path), kv)); err != nil {
		return lakeFile{}, err
	}
	if err := lake.Sync(path); err != nil {
		return lakeFile{}, err
	}
	var n int64
	if err := w.conn.QueryRowContext(ctx, "SELECT count(*) FROM read_parquet("+literal(path)+")").Scan(&n); err != nil {
		return lakeFile{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return lakeFile{}, err
	}
	return lakeFile{File: f, table: t, topic: b.meta[metaTopic], topicID: b.meta[metaTopicID], day: day, part: s.Partition, first: s.First, last: s.Last,
		n: n, minSeq: uint64(s.MinSeq), maxSeq: uint64(s.MaxSeq), size: fi.Size(), batch: newest.Batch}, nil
}

// recordCompacted lists merged files in lakeflow.lake_files.
func (w *Warehouse) recordCompacted(ctx context.Context, files []lakeFile) error {
	for _, f := range files {
		if _, err := w.conn.ExecContext(ctx, "INSERT INTO lakeflow.lake_files VALUES (?, ?, ?::DATE, ?, ?, ?, ?, ?, ?, ?, ?, now(), ?, ?)",
			f.Path, f.table.schema.ID(), f.day, cmp.Or(f.topic, f.table.topic), f.part, f.first, f.last, f.n, f.minSeq, f.maxSeq, f.size, f.topicID, f.batch); err != nil {
			return err
		}
	}
	return nil
}

// swapCompacted exchanges a recorded compaction's day with the day's
// directory, unless a crash left it exchanged already, and records that
// it is.
func (w *Warehouse) swapCompacted(ctx context.Context, dir, day, id string) error {
	if err := w.lake.FinishExchange(dir, day, id); err != nil {
		return err
	}
	var files []any
	if err := w.conn.QueryRowContext(ctx, "SELECT files FROM lakeflow.compactions WHERE id = ?", id).Scan(&files); err != nil {
		return err
	}
	swapped := len(files) > 0
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(w.lake.DayDir(dir, day), fmt.Sprint(f))); err != nil {
			swapped = false
			break
		}
	}
	if !swapped {
		if err := w.lake.Exchange(dir, day, id); err != nil {
			return err
		}
	}
	crash.Point(crash.CompactSwapped)
	_, err := w.conn.ExecContext(ctx, "UPDATE lakeflow.compactions SET swapped_at = now() WHERE id = ?", id)
	return err
}

// recoverCompactions finishes the compactions a crash interrupted: one
// recorded is exchanged (if it was not yet), a day built but not recorded
// is removed (the lake and lakeflow.lake_files still list the old files).
func (w *Warehouse) recoverCompactions(ctx context.Context) error {
	ids, err := w.lake.CompactIDs()
	if err != nil || len(ids) == 0 {
		return err
	}
	var unlock func()
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	for _, id := range ids {
		var table, day string
		var swapped *time.Time
		err := w.conn.QueryRowContext(ctx, "SELECT source_table, strftime(day, '%Y-%m-%d'), swapped_at FROM lakeflow.compactions WHERE id = ?", id).Scan(&table, &day, &swapped)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if err := w.lake.RemoveCompaction(id); err != nil {
				return err
			}
		case err != nil:
			return err
		case swapped == nil:
			// The id starts with the table's lake directory (a table taken
			// out of source.tables since is not registered).
			dir, _, _ := strings.Cut(id, "~")
			if unlock == nil {
				if unlock, err = w.lake.LockSwaps(false); errors.Is(err, lake.ErrReadersHold) {
					w.log.Info("waiting for readers of the lake (lakeflow asof, check) to let go of it, to finish a compaction a crash interrupted", "table", table, "day", day)
					unlock, err = w.lake.LockSwaps(true)
				}
				if err != nil {
					return err
				}
			}
			if err := w.swapCompacted(ctx, dir, day, id); err != nil {
				return unfinished(err)
			}
			w.log.Info("a compaction a crash interrupted is finished", "table", table, "day", day)
		}
	}
	return nil
}

// RemoveCompacted removes the old days of compactions swapped more than
// grace ago, and reports how many (Compact does first; lakeflow run also
// hourly, whether or not it compacts).
func (w *Warehouse) RemoveCompacted(ctx context.Context, grace time.Duration) (int, error) {
	ids, err := w.stringSet(ctx, fmt.Sprintf("SELECT id FROM lakeflow.compactions WHERE swapped_at < now() - to_microseconds(%d)", grace.Microseconds()))
	if err != nil {
		return 0, err
	}
	for id := range ids {
		if err := w.lake.RemoveCompaction(id); err != nil {
			return 0, err
		}
		if _, err := w.conn.ExecContext(ctx, "DELETE FROM lakeflow.compactions WHERE id = ?", id); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}
