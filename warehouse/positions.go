package warehouse

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// What the lake's files say of the positions they hold, read from their
// names and metadata alone (lakeflow asof never opens the live
// warehouse).

// LakeEvent is an event of the lake: its position and commit time.
type LakeEvent struct {
	Seq    change.LSN
	Commit time.Time
}

// LakeEnds returns the lake's first and last events (by position), and
// ok = false if it holds none.
func (w *Warehouse) LakeEnds(ctx context.Context) (first, last LakeEvent, ok bool, err error) {
	parts, err := w.allParts()
	if err != nil || len(parts) == 0 {
		return first, last, false, err
	}
	lo := slices.MinFunc(parts, func(a, b lake.Part) int { return cmp.Compare(a.Span.MinSeq, b.Span.MinSeq) })
	hi := slices.MaxFunc(parts, func(a, b lake.Part) int { return cmp.Compare(a.Span.MaxSeq, b.Span.MaxSeq) })
	if first, err = w.lakeEvent(ctx, lo.Path, lo.Span.MinSeq); err != nil {
		return first, last, false, err
	}
	last, err = w.lakeEvent(ctx, hi.Path, hi.Span.MaxSeq)
	return first, last, err == nil, err
}

// lakeEvent reads the commit time of the event at seq in a lake file.
func (w *Warehouse) lakeEvent(ctx context.Context, path string, seq change.LSN) (LakeEvent, error) {
	ev := LakeEvent{Seq: seq}
	err := w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT min(_commit_ts) FROM read_parquet(%s) WHERE _cdc_seq = %d",
		literal(w.lake.Abs(path)), uint64(seq))).Scan(&ev.Commit)
	ev.Commit = ev.Commit.UTC()
	return ev, err
}

// allParts lists every table's lake files.
func (w *Warehouse) allParts() ([]lake.Part, error) {
	dirs, err := w.lake.Tables()
	if err != nil {
		return nil, err
	}
	var out []lake.Part
	for _, d := range dirs {
		parts, err := w.parts(d)
		if err != nil {
			return nil, err
		}
		out = append(out, parts...)
	}
	return out, nil
}

// parts lists a table's lake files. A view lists the lake once, so
// every question it answers is about the same files; a pipeline's
// warehouse (which alone writes the lake) asks the directory.
func (w *Warehouse) parts(dir string) ([]lake.Part, error) {
	if w.view == nil {
		return w.lake.Parts(dir)
	}
	if w.listing == nil {
		if err := w.listLake(); err != nil {
			return nil, err
		}
	}
	return w.listing[dir], nil
}

// listLake takes the view's listing of the lake, and the position up to
// which it holds whole batches: a batch being published (a running
// pipeline renames its files one by one) or half published (a crash)
// has files staged, or published between two listings; the view stops
// below the smallest position they hold.
func (w *Warehouse) listLake() error {
	// What the view lists stays where it is until it closes.
	if w.releaseLake == nil {
		release, err := w.lake.HoldFiles()
		if err != nil {
			return fmt.Errorf("hold the lake's files: %w", err)
		}
		w.releaseLake = release
	}
	list := func() (map[string][]lake.Part, error) {
		dirs, err := w.lake.Tables()
		if err != nil {
			return nil, err
		}
		out := map[string][]lake.Part{}
		for _, d := range dirs {
			if out[d], err = w.lake.Parts(d); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	first, err := list()
	if err != nil {
		return err
	}
	staged, err := w.lake.Staged()
	if err != nil {
		return err
	}
	again, err := list()
	if err != nil {
		return err
	}
	w.complete = change.LSN(math.MaxUint64)
	for _, s := range staged {
		w.complete = min(w.complete, s-1)
	}
	for d, parts := range again {
		for _, p := range parts {
			if !slices.ContainsFunc(first[d], func(q lake.Part) bool { return q.Path == p.Path }) {
				w.complete = min(w.complete, p.Span.MinSeq-1)
			}
		}
	}
	w.listing = first
	return nil
}

// Complete is the position up to which a view's listing of the lake
// holds whole batches (math.MaxUint64: all of it).
func (w *Warehouse) Complete() (change.LSN, error) {
	if w.listing == nil {
		if err := w.listLake(); err != nil {
			return 0, err
		}
	}
	return w.complete, nil
}

// LastWhole is the position of the newest batch whose files the lake
// holds that ended at a source transaction boundary, and whether the lake
// holds changes after it: those come from batches that held part of a
// transaction larger than the batch limits, whose rest the lake may not
// hold yet (ok is false for a lake whose files name no batch).
func (w *Warehouse) LastWhole(ctx context.Context) (whole change.LSN, after, ok bool, err error) {
	bs, err := w.BatchPositions(ctx, 1, 0)
	if err != nil || len(bs) == 0 {
		return 0, false, false, err
	}
	parts, err := w.allParts()
	if err != nil {
		return 0, false, false, err
	}
	for _, p := range parts {
		after = after || p.Span.MaxSeq > bs[0].Seq
	}
	return bs[0].Seq, after, true, nil
}

// PrefixAt returns the end of the longest stretch of the log whose
// transactions all committed at or before t: the position just before
// the first transaction (by position) that committed after it. Commit
// times can run a little out of position order; a prefix is a state
// silver had. after says no transaction committed after t.
func (w *Warehouse) PrefixAt(ctx context.Context, t time.Time) (seq change.LSN, after bool, err error) {
	parts, err := w.allParts()
	if err != nil {
		return 0, false, err
	}
	var files []string
	day := t.UTC().Format(time.DateOnly)
	for _, p := range parts {
		if p.Day >= day { // a commit after t is on its day or later
			files = append(files, w.lake.Abs(p.Path))
		}
	}
	if len(files) == 0 {
		return 0, true, nil
	}
	var first *uint64
	err = w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT min(_cdc_seq) FROM read_parquet(%s) WHERE _commit_ts > make_timestamptz(%d)",
		sqlList(files), t.UnixMicro())).Scan(&first)
	if err != nil || first == nil {
		return 0, err == nil, err
	}
	return change.LSN(*first - 1), false, nil
}

// ErrNotInLake is the error of a Kafka record the lake does not hold.
var ErrNotInLake = errors.New("not in the lake")

// KafkaSeq returns the position of the record at offset off of partition
// part of topic, a topic of table t, from the lake: the newest file of
// that topic that holds it (a reset topic starts its offsets again). A
// record past the lake's last of that partition gives after = true.
func (w *Warehouse) KafkaSeq(ctx context.Context, t *change.Table, topic string, part int32, off int64) (seq change.LSN, after bool, err error) {
	parts, err := w.parts(lakeDir(t))
	if err != nil {
		return 0, false, err
	}
	var files []string
	for _, p := range parts {
		if p.Span.Partition == part {
			files = append(files, w.lake.Abs(p.Path))
		}
	}
	meta, err := w.lakeMetadata(ctx, files)
	if err != nil {
		return 0, false, err
	}
	high := int64(-1)
	var hold []lake.Part
	for _, p := range parts {
		if p.Span.Partition != part || meta[w.lake.Abs(p.Path)][metaTopic] != topic {
			continue
		}
		high = max(high, p.Span.Last)
		if p.Span.First <= off && off <= p.Span.Last {
			hold = append(hold, p)
		}
	}
	// Newest first: the log as it is now, where offsets are what a user
	// reads in Kafka today.
	slices.SortFunc(hold, func(a, b lake.Part) int { return cmp.Compare(b.Span.MinSeq, a.Span.MinSeq) })
	for _, p := range hold {
		var s *uint64
		err = w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT max(_cdc_seq) FROM read_parquet(%s) WHERE kafka_offset = %d",
			literal(w.lake.Abs(p.Path)), off)).Scan(&s)
		if err != nil {
			return 0, false, err
		}
		if s != nil {
			return change.LSN(*s), false, nil
		}
	}
	if len(hold) == 0 && high >= 0 && off > high {
		return 0, true, nil
	}
	return 0, false, ErrNotInLake // before the first, or a dead letter
}

// BatchPositions returns the positions of consistent batches that the
// lake's files name, newest first: the last n of them, or, with batch >
// 0, that batch's alone (none if no file names it). Files are read from
// the newest back, only as far as needed.
func (w *Warehouse) BatchPositions(ctx context.Context, n int, batch int64) ([]BatchPosition, error) {
	parts, err := w.allParts()
	if err != nil {
		return nil, err
	}
	slices.SortFunc(parts, func(a, b lake.Part) int { return cmp.Compare(b.Span.MaxSeq, a.Span.MaxSeq) })
	seen := map[int64]BatchPosition{}
	merged, listed := false, map[string]bool{}
	for i, step := 0, 64; i < len(parts); i, step = i+step, step*2 {
		files := make([]string, 0, step)
		for _, p := range parts[i:min(i+step, len(parts))] {
			files = append(files, w.lake.Abs(p.Path))
		}
		meta, err := w.lakeMetadata(ctx, files)
		if err != nil {
			return nil, err
		}
		oldest := int64(-1)
		for _, f := range files {
			named := []BatchPosition{}
			if b, ok := batchPosition(meta[f]); ok {
				named = append(named, b)
			}
			if meta[f][metaBatches] != "" && !listed[filepath.Dir(f)] {
				// A merged file: its day lists the batches of the files it
				// replaced, a span that files of other partitions, read
				// later, may share: the files' order says no more where a
				// batch is.
				merged, listed[filepath.Dir(f)] = true, true
				day, err := w.dayBatches(ctx, filepath.Dir(f))
				if err != nil {
					return nil, err
				}
				named = append(named, day...)
			}
			for _, b := range named {
				if b.Seq == 0 {
					continue // not a consistent batch, or written before lakeflow named them
				}
				if prev, dup := seen[b.Batch]; dup && prev.Seq > b.Seq {
					continue // a lake rebuilt by an older lakeflow numbered batches again: the newer stands
				}
				seen[b.Batch] = b
				if oldest < 0 || b.Batch < oldest {
					oldest = b.Batch
				}
			}
		}
		if batch > 0 {
			if b, ok := seen[batch]; ok {
				return []BatchPosition{b}, nil
			}
			if oldest >= 0 && oldest < batch && !merged {
				return nil, nil // older files name older batches only
			}
		} else if len(seen) >= n && oldest >= 0 && !merged {
			break
		}
	}
	if batch > 0 {
		return nil, nil
	}
	out := make([]BatchPosition, 0, len(seen))
	for _, b := range seen {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b BatchPosition) int { return int(b.Batch - a.Batch) })
	return out[:min(n, len(out))], nil
}

// ReadByLinks makes this view read hard links of the files it listed,
// made under dir (on the lake's file system), instead of the lake's own,
// and lets go of the lake's swap lock: compaction may swap days while
// the view reads on (a checkpoint's build, which replays for long, would
// hold it off otherwise). A merged day's list of batches is linked with
// its files.
func (w *Warehouse) ReadByLinks(dir string) error {
	if w.view == nil {
		return fmt.Errorf("only a view of the lake reads it by links")
	}
	if _, err := w.Complete(); err != nil { // the listing, under the lock
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	link := func(rel string) error {
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.Link(w.lake.Abs(rel), dst)
	}
	days := map[string]bool{}
	for _, parts := range w.listing {
		for _, p := range parts {
			if err := link(p.Path); err != nil {
				return fmt.Errorf("link the lake's files: %w", err)
			}
			day := filepath.Dir(p.Path)
			if days[day] {
				continue
			}
			days[day] = true
			batches := filepath.Join(day, lake.BatchesFile)
			if _, err := os.Stat(w.lake.Abs(batches)); err == nil {
				if err := link(batches); err != nil {
					return fmt.Errorf("link the lake's files: %w", err)
				}
			}
		}
	}
	linked, err := lake.OpenExisting(dir)
	if err != nil {
		return err
	}
	w.lake = linked
	w.releaseLake()
	w.releaseLake = func() {}
	return nil
}
