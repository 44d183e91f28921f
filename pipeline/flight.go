package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/lakeflow/lakeflow/internal/stage"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// A batch applied beside the consumer's loop, and what its outcome does
// (the consumer's, consume.go).

// flightPoll bounds a poll's wait while a batch is being applied, so that
// the loop takes its result soon after it ends.
const flightPoll = 20 * time.Millisecond

// flight is a batch being applied beside the consumer's loop: while
// DuckDB merges it, the loop fetches, and stages the next batch on a
// connection of its own (warehouse.Stage), two cores at work where one
// was. The loop counts its positions as committed from the start: a batch
// that fails stops the run (its records are spent), and the next start
// reads them again from Kafka.
type flight struct {
	batch  warehouse.Batch
	staged *warehouse.Staged
	done   chan struct{}
	st     warehouse.BatchStats
	err    error
	// ended is when ApplyStaged returned, after took.
	ended time.Time
	took  time.Duration
}

// landed says whether the batch has been applied (or failed).
func (f *flight) landed() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// apply stages the records of the batch ending at m (nil: a part of the
// transaction being split, c.splitting) and sets them off as one batch,
// once the batch before has been applied.
func (c *consumer) apply(ctx context.Context, m *mark) error {
	// Schema records are acknowledged before the events that need them,
	// so reading the schema topic now covers everything in the batch.
	if err := c.syncSchemas(ctx); err != nil {
		return err
	}
	batch := warehouse.Batch{Positions: map[string]warehouse.TopicPosition{}}
	// A batch ends consistent at a watermark, unless that is behind the
	// transaction being split (its batch keeps strays, nothing else).
	consistent := m != nil && !m.w.Split && m.w.Seq >= c.splitting
	if !consistent {
		batch.Open = c.splitting
	}
	var rest []warehouse.Record
	batch.Records, rest = c.take(m)
	for _, r := range batch.Records {
		pos, ok := batch.Positions[r.Topic]
		if !ok {
			pos = clonePosition(c.committed[r.Topic])
			batch.Positions[r.Topic] = pos
		}
		pos.Next[r.Partition] = max(pos.Next[r.Partition], r.Offset+1)
	}
	// The strays a batch reads past (those of the watermark topic before
	// its mark) become its dead letters.
	keep := c.strays[:0:0]
	for _, d := range c.strays {
		if d.Topic != c.wmTopic() || (m != nil && d.Offset < m.offset) {
			batch.Dead = append(batch.Dead, d)
		} else {
			keep = append(keep, d)
		}
	}
	c.strays = keep
	if m != nil {
		wm := clonePosition(c.committed[c.wmTopic()])
		wm.Next[0] = m.offset + 1
		batch.Positions[c.wmTopic()] = wm
		// The mark's bounds that the warehouse does not hold: a restart
		// starts from them.
		for topic, parts := range m.bounds {
			for p, b := range parts {
				if saved, ok := c.savedBounds[topic][p]; ok && saved == b {
					continue
				}
				if batch.Bounds == nil {
					batch.Bounds = map[string]map[int32]int64{}
				}
				if batch.Bounds[topic] == nil {
					batch.Bounds[topic] = map[int32]int64{}
				}
				batch.Bounds[topic][p] = b
				if _, ok := batch.Positions[topic]; !ok {
					batch.Positions[topic] = clonePosition(c.committed[topic])
				}
			}
		}
		if consistent {
			// A copy: the batch is applied after its mark has left
			// c.marks, whose array dropMarks reuses.
			w := m.w
			batch.Watermark = &w
		}
	}
	if f := c.flight; f != nil {
		// The staging tables are single: the batch before has read them
		// first.
		select {
		case <-f.staged.Read():
		case <-f.done:
		}
	}
	stage.Enter(stage.Staging)
	staged, err := c.wh.Stage(statement(ctx), batch.Records)
	stage.Enter(stage.Fetch)
	if err != nil {
		return errors.Join(err, c.settle(ctx))
	}
	// Nothing reads the records' values again: release them, so that
	// nothing holds them through the batch's merge.
	c.pending = rest
	release(batch.Records)
	if err := c.settle(ctx); err != nil {
		return err
	}
	maps.Copy(c.committed, batch.Positions)
	for topic, parts := range batch.Bounds {
		if c.savedBounds[topic] == nil {
			c.savedBounds[topic] = map[int32]int64{}
		}
		maps.Copy(c.savedBounds[topic], parts)
	}
	// The batch reads no schema: the loop's next look is due
	// batch_interval after it was set off.
	c.synced = time.Now()
	if m != nil {
		c.dropMarks(m.offset)
	}
	if batch.Watermark != nil {
		c.seq = max(c.seq, batch.Watermark.Seq)
		if c.splitting <= c.seq {
			c.splitting, c.splitDone = 0, false
		}
	}
	c.bytes = 0
	c.oldest = time.Now()
	for _, r := range rest {
		c.bytes += int64(len(r.Value))
		if r.Arrived.Before(c.oldest) {
			c.oldest = r.Arrived
		}
	}
	f := &flight{batch: batch, staged: staged, done: make(chan struct{})}
	c.flight = f
	go func() {
		defer close(f.done)
		start := time.Now()
		f.st, f.err = c.wh.ApplyStaged(ctx, batch, staged)
		f.ended = time.Now()
		f.took = f.ended.Sub(start)
	}()
	return nil
}

// settle waits for the batch being applied, if any, and takes in its
// outcome. A batch that failed ends the run: its records are spent, and
// nothing after it may be applied before it. One that committed without
// its lake files published (warehouse.ErrUnpublished) ends it too: the
// next start publishes them.
func (c *consumer) settle(ctx context.Context) error {
	f := c.flight
	if f == nil {
		return nil
	}
	<-f.done
	c.flight = nil
	st, err := f.st, f.err
	if err != nil && !errors.Is(err, warehouse.ErrUnpublished) {
		return spentError{err}
	}
	if f.batch.Watermark != nil {
		c.applied.Store(max(c.applied.Load(), uint64(f.batch.Watermark.End)))
	}
	if c.idleEnd > 0 {
		// A watermark with nothing to apply came after the batch.
		c.applied.Store(max(c.applied.Load(), uint64(c.idleEnd)))
	}
	c.idleEnd = 0
	c.stats.events.Add(int64(st.Events))
	c.stats.batches.Add(1)
	c.stats.files.Add(int64(st.LakeFiles))
	c.stats.quarantined.Add(int64(st.Quarantined))
	c.stats.phases.Add(st)
	if c.metrics != nil {
		c.metrics.batch(st, f.batch.Watermark, st.Stage+f.took, f.ended)
		c.metrics.pending.Set(float64(len(c.pending)))
	}
	if len(st.Dead) > 0 {
		c.deadLetters(ctx, st.Dead)
	}
	c.log.Debug("batch committed", "events", st.Events, "tables", st.Tables, "lake_files", st.LakeFiles,
		"consistent", f.batch.Watermark != nil,
		"stage", st.Stage.Round(time.Millisecond), "decode", st.Decode.Round(time.Millisecond), "lake", st.Lake.Round(time.Millisecond),
		"rules", st.Rules.Round(time.Millisecond), "history", st.History.Round(time.Millisecond), "merge", st.Merge.Round(time.Millisecond),
		"gold", st.Gold.Round(time.Millisecond), "commit", st.Commit.Round(time.Millisecond),
		"quarantined", st.Quarantined, "warned", st.Warned, "dead", len(st.Dead))
	c.trim(ctx)
	return err
}

// seenAsTarget is what has been received, as a drain target.
func (c *consumer) seenAsTarget() map[string]map[int32]int64 {
	out := map[string]map[int32]int64{}
	for t, p := range c.seen {
		out[t] = p.Next
	}
	return out
}

// deadLetters says loudly that events were set aside, and announces
// them on <prefix>.dlq (lakeflow.dlq and the lake hold them already).
func (c *consumer) deadLetters(ctx context.Context, dead []warehouse.DeadLetter) {
	total := c.stats.dead.Add(int64(len(dead)))
	if c.metrics != nil {
		c.metrics.dead.Add(float64(len(dead)))
	}
	c.log.Warn("events could not be applied and went to the dead-letter queue (lakeflow.dlq)",
		"events", len(dead), "this_run", total, "first", dead[0].Topic+"/"+fmt.Sprint(dead[0].Partition)+"@"+fmt.Sprint(dead[0].Offset)+": "+dead[0].Reason)
	out := make([]kafka.DeadLetter, len(dead))
	for i, d := range dead {
		out[i] = kafka.DeadLetter(d)
	}
	if err := c.kafka.DeadLetters(ctx, out); err != nil {
		c.log.Warn("announcing dead letters on Kafka failed; lakeflow.dlq and the lake hold them", "err", err)
	}
}
