package warehouse

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/lake"
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
		parts, err := w.lake.Parts(d)
		if err != nil {
			return nil, err
		}
		out = append(out, parts...)
	}
	return out, nil
}

// ErrNotInLake is the error of a Kafka record the lake does not hold.
var ErrNotInLake = errors.New("not in the lake")

// KafkaSeq returns the position of the record at offset off of partition
// part of table t's topic, from the lake file that holds it (the newest, if
// the topic was reset and two hold that offset). A record past the
// lake's last of that partition gives after = true.
func (w *Warehouse) KafkaSeq(ctx context.Context, t *change.Table, part int32, off int64) (seq change.LSN, after bool, err error) {
	parts, err := w.lake.Parts(lakeDir(t))
	if err != nil {
		return 0, false, err
	}
	var hold *lake.Part
	high := int64(-1)
	for i, p := range parts {
		if p.Span.Partition != part {
			continue
		}
		high = max(high, p.Span.Last)
		if p.Span.First <= off && off <= p.Span.Last && (hold == nil || p.Span.MinSeq > hold.Span.MinSeq) {
			hold = &parts[i]
		}
	}
	if hold == nil {
		if high >= 0 && off > high {
			return 0, true, nil
		}
		return 0, false, ErrNotInLake
	}
	var s *uint64
	err = w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT max(_cdc_seq) FROM read_parquet(%s) WHERE kafka_offset = %d",
		literal(w.lake.Abs(hold.Path)), off)).Scan(&s)
	if err != nil {
		return 0, false, err
	}
	if s == nil {
		// Within the file's span but not in it: a dead letter.
		return 0, false, ErrNotInLake
	}
	return change.LSN(*s), false, nil
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
			b, ok := batchPosition(meta[f])
			if !ok {
				continue
			}
			seen[b.Batch] = b
			if oldest < 0 || b.Batch < oldest {
				oldest = b.Batch
			}
		}
		if batch > 0 {
			if b, ok := seen[batch]; ok {
				return []BatchPosition{b}, nil
			}
			if oldest >= 0 && oldest < batch {
				return nil, nil // older files name older batches only
			}
		} else if len(seen) >= n && oldest >= 0 {
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
