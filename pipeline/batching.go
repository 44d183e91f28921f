package pipeline

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Where a batch ends: the watermarks and split marks the consumer holds,
// the records of each, and when a batch is due (the consumer's,
// consume.go).

// age is how long the records held have waited: since the oldest of them
// reached Kafka (those that arrived while the batch before was applied
// have waited that long already).
func (c *consumer) age() time.Duration { return time.Since(c.oldest) }

// waited says whether the records held have waited batch_interval. While
// the consumer is behind (Kafka held more than it returned) they never
// have: records waiting in Kafka are old, and by their age every poll
// would be a batch, where full batches catch up faster; the batch ends
// full, or once the consumer has caught up. Nor have they in a run that
// stops at the WAL's end until the source has delivered it all
// (delivered): the source is draining a known backlog and batches fill
// in moments, while closing them by age makes small ones, each paying a
// batch's fixed statements while the source and the walsender hold the
// cores; freshness is not what such a run is for (a live one keeps the
// age rule throughout: --follow, or the demo, whose workload makes the
// changes as it reads them, and whose batches are the positions asof
// travels between).
func (c *consumer) waited(delivered bool) bool {
	return (c.follow || c.workload || delivered) && !c.kafka.Behind() && c.age() >= c.cfg.BatchInterval
}

// arrival is when a record reached Kafka (its timestamp), or now if the
// timestamp is later (another clock).
func arrival(ts time.Time) time.Time {
	if now := time.Now(); ts.IsZero() || ts.After(now) {
		return now
	}
	return ts
}

// addMark folds a watermark record into the bounds, and reports whether
// it was one: a record lakeflow did not write (Signer) is a stray, set
// aside as a dead letter, so that no record another client writes to
// the topic can stop the consumer or move where batches end. A bound
// never moves back: lakeflow's watermarks only move forward in a topic.
func (c *consumer) addMark(r *kgo.Record) bool {
	w, stray := c.kafka.Watermark(r)
	if stray != nil {
		c.stray(*stray)
		return false
	}
	for topic, parts := range w.Offsets {
		if c.bounds[topic] == nil {
			c.bounds[topic] = map[int32]int64{}
		}
		for p, end := range parts {
			c.bounds[topic][p] = max(c.bounds[topic][p], end)
		}
	}
	b := make(map[string]map[int32]int64, len(c.bounds))
	for topic, parts := range c.bounds {
		b[topic] = maps.Clone(parts)
	}
	c.marks = append(c.marks, mark{w: w, offset: r.Offset, bounds: b})
	return true
}

// stray sets a record of a meta topic aside: the next batch keeps it as
// a dead letter (lakeflow.dlq, the lake's _dlq, <prefix>.dlq).
func (c *consumer) stray(s kafka.Stray) {
	c.log.Warn("a record lakeflow did not write is set aside as a dead letter", "topic", s.Topic, "offset", s.Offset, "reason", s.Reason)
	c.strays = append(c.strays, deadStray(s))
}

// deadStray is the dead letter of a stray record.
func deadStray(s kafka.Stray) warehouse.DeadLetter {
	return warehouse.DeadLetter{Topic: s.Topic, Partition: s.Partition, Offset: s.Offset, Stage: "meta", Reason: s.Reason, Payload: s.Value}
}

// step applies a batch if one is due: up to the newest watermark whose
// records have all arrived, once that batch is full or old enough, or
// ends the drain, or the records held reach batch_bytes; a watermark with
// nothing to apply makes no batch (idle). When the records held reach
// batch_bytes with no watermark in reach (a huge transaction), the
// transaction a split mark names is applied in part, and nothing after
// it. A batch grows past batch_events to end at a transaction boundary.
func (c *consumer) step(ctx context.Context, target map[string]map[int32]int64) error {
	// A split mark of a transaction silver holds (read again after a
	// restart) is none, nor is one before the transaction being split
	// (records past it may have been applied): forgotten, they hold up
	// nothing, not even the end of a drain.
	c.marks = slices.DeleteFunc(c.marks, func(m mark) bool { return m.w.Split && (m.w.Seq <= c.seq || m.w.Seq < c.splitting) })
	k, split := c.ready()
	hard := c.bytes >= c.cfg.BatchBytes
	if hard && split > k {
		m := c.marks[split]
		c.splitting, c.splitDone = m.w.Seq, false
		return c.apply(ctx, &m)
	}
	if c.splitting != 0 && !c.splitDone {
		if n, _ := c.held(nil); n == 0 {
			// Nothing held is of the transaction (one a kill abandoned
			// never ends, or its last part is applied): what is held
			// waits for a watermark, which no paused partition may hold
			// up (pace).
			c.splitDone = true
		}
	}
	if k < 0 {
		if hard && c.splitting != 0 && !c.splitDone {
			return c.apply(ctx, nil)
		}
		return nil
	}
	m := &c.marks[k]
	n, size := c.held(m)
	if n == 0 && c.idles(m) {
		c.idle(m)
		return nil
	}
	last := target != nil && n == len(c.pending) && reached(c.seen, target)
	if n == 0 || last || hard || n >= c.cfg.BatchEvents || size >= c.cfg.BatchBytes || c.waited(target != nil) {
		return c.apply(ctx, m)
	}
	return nil
}

// ready returns the newest watermark whose records have all arrived and
// the newest split mark after it that has, -1 for none.
func (c *consumer) ready() (k, split int) {
	k, split = -1, -1
	for i := len(c.marks) - 1; i >= 0; i-- {
		if !c.arrived(&c.marks[i]) {
			continue
		}
		if !c.marks[i].w.Split {
			return i, split
		}
		if split < 0 {
			split = i
		}
	}
	return k, split
}

// sort tells the records held of the batch ending at m (nil: the
// transaction being split) from the rest, calling f for each in order: in
// each partition, those before the first record after m's position (a
// split mark's: after the transaction) are in, and, at a watermark, those
// below its bounds.
func (c *consumer) sort(m *mark, f func(r *warehouse.Record, in bool)) {
	seq, bounded := c.splitting, false
	if m != nil && !m.w.Split {
		seq, bounded = m.w.Seq, true
	}
	if c.cut == nil {
		c.cut = map[kafka.TopicPartition]bool{}
	}
	clear(c.cut)
	for i := range c.pending {
		r := &c.pending[i]
		tp := kafka.TopicPartition{Topic: r.Topic, Partition: r.Partition}
		if r.Seq > seq {
			c.cut[tp] = true
		}
		f(r, !c.cut[tp] && (!bounded || r.Offset < m.bounds[r.Topic][r.Partition]))
	}
}

// take splits the records held into those of the batch ending at m and
// the rest (sort).
func (c *consumer) take(m *mark) (in, rest []warehouse.Record) {
	in = make([]warehouse.Record, 0, len(c.pending))
	// An array with room for as many as were pending (not
	// c.pending[:0:0]: that keeps the records' array live): grown a
	// record at a time from their number, they were copied again and
	// again while the consumer was behind.
	rest = make([]warehouse.Record, 0, len(c.pending))
	c.sort(m, func(r *warehouse.Record, ok bool) {
		if ok {
			in = append(in, *r)
		} else {
			rest = append(rest, *r)
		}
	})
	return in, rest
}

// held counts the records held of the batch ending at m and their bytes,
// without taking them: the loop asks every poll whether a batch is due.
func (c *consumer) held(m *mark) (n int, size int64) {
	c.sort(m, func(r *warehouse.Record, ok bool) {
		if ok {
			n++
			size += int64(len(r.Value))
		}
	})
	return n, size
}

// idles says whether m, a watermark up to which there is nothing to
// apply, needs no batch: none when it ends a transaction applied in parts
// (its batch, empty, says silver is consistent again) or the records of
// the watermark topic before it hold strays (its batch keeps them as dead
// letters). One behind the transaction being split (the source says
// again where it stands, for a partition it opened meanwhile) ends
// nothing.
func (c *consumer) idles(m *mark) bool {
	return (c.splitting == 0 || m.w.Seq < c.splitting) &&
		!slices.ContainsFunc(c.strays, func(d warehouse.DeadLetter) bool { return d.Offset <= m.offset })
}

// idle takes a watermark up to which there is nothing to apply: the
// source passed transactions of other tables (a heartbeat is one), or
// sent again one silver holds. It makes no batch (an idle pipeline writes
// nothing): the slot may be confirmed up to it once every batch before
// it has committed, and one at or behind silver's position changes
// nothing.
func (c *consumer) idle(m *mark) {
	if m.w.Seq > c.seq {
		c.seq = m.w.Seq
		if c.flight == nil {
			c.applied.Store(max(c.applied.Load(), uint64(m.w.End)))
		} else {
			c.idleEnd = max(c.idleEnd, m.w.End)
		}
	}
	// A split mark after it, of a transaction it does not reach, is
	// still to come into use.
	k := 0
	for _, o := range c.marks {
		if o.offset > m.offset || (o.w.Split && o.w.Seq > m.w.Seq) {
			c.marks[k] = o
			k++
		}
	}
	c.marks = c.marks[:k]
}

// pace pauses fetching from partitions that hold everything the next
// watermark needs while another partition still lags behind it, so the
// records a watermark covers arrive together and batches can end there
// (one busy partition would otherwise fill the batch on its own). It
// resumes them once that watermark is complete. While a transaction is
// applied in parts, partitions already past it wait too.
func (c *consumer) pace() {
	want := map[kafka.TopicPartition]bool{}
	var next *mark
	for i := range c.marks {
		if !c.arrived(&c.marks[i]) {
			next = &c.marks[i]
			break
		}
	}
	if next != nil && !c.assigned(next.bounds) {
		next = nil // pausing would wait for a topic not read yet
	}
	for topic, pos := range c.seen {
		if topic == c.wmTopic() || topic == kafka.SchemaTopic(c.kcfg.Prefix) {
			continue
		}
		for p := range pos.Next {
			tp := kafka.TopicPartition{Topic: topic, Partition: p}
			if (next != nil && c.holds(next, tp)) || (c.splitting != 0 && !c.splitDone && c.last[tp] > c.splitting) {
				want[tp] = true
			}
		}
	}
	c.kafka.Pause(want)
}

// dropMarks forgets the watermarks up to the one at offset.
func (c *consumer) dropMarks(offset int64) {
	k := 0
	for k < len(c.marks) && c.marks[k].offset <= offset {
		k++
	}
	c.marks = append(c.marks[:0], c.marks[k:]...)
}

// assigned reports whether every topic bounds names is consumed.
func (c *consumer) assigned(bounds map[string]map[int32]int64) bool {
	for topic := range bounds {
		if _, ok := c.seen[topic]; !ok {
			return false
		}
	}
	return true
}

// arrived reports whether every record m's batch needs has been
// received: in each partition its bounds name, every record below the
// bound, or one after m's position (a split mark's: at it), after which
// the partition holds only later ones.
func (c *consumer) arrived(m *mark) bool {
	for topic, parts := range m.bounds {
		if _, ok := c.seen[topic]; !ok {
			return false
		}
		for p := range parts {
			if !c.holds(m, kafka.TopicPartition{Topic: topic, Partition: p}) {
				return false
			}
		}
	}
	return true
}

// holds says whether partition tp has delivered every record m needs.
func (c *consumer) holds(m *mark, tp kafka.TopicPartition) bool {
	last, ok := c.last[tp]
	return c.seen[tp.Topic].Next[tp.Partition] >= m.bounds[tp.Topic][tp.Partition] ||
		(ok && (last > m.w.Seq || (m.w.Split && last == m.w.Seq)))
}
