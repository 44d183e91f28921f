package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/stage"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// finishTimeout bounds what is left after a cancel: reading the schemas
// and staging the records held (a batch once staged runs to its end:
// warehouse.ApplyStaged).
const finishTimeout = time.Minute

// trimInterval is how often committed records are trimmed from Kafka
// (tests shorten it).
var trimInterval = 30 * time.Second

// consumer moves records from Kafka into the lake and the warehouse, one
// batch (one DuckDB transaction) at a time, staging the next while one is
// applied (flight). A batch ends at a watermark (a source transaction
// boundary that is complete in every partition): it takes, in each
// partition, the records up to the watermark's position (its bounds may
// hold later ones, written before a restart), so silver is always the
// source as of one position. Only a transaction larger than the batch
// limits is applied in several batches, after a split mark says that
// everything before it is in: those batches hold it in part and nothing
// after it, and the last, at its watermark, is the consistent one. No
// batch is made without a mark.
type consumer struct {
	cfg    config.Pipeline
	kcfg   kafka.Config
	slot   string
	kafka  *kafka.Consumer
	wh     *warehouse.Warehouse
	log    *slog.Logger
	follow bool
	// workload: a workload makes changes while the run reads them (the
	// demo's), so batches close by age, as under follow, not only when
	// full.
	workload   bool
	sourceDone <-chan struct{}

	// committed and seen are, per topic, where the consumer stands after
	// what is committed and after what it holds (committed or pending).
	committed map[string]warehouse.TopicPosition
	seen      map[string]warehouse.TopicPosition
	pending   []warehouse.Record
	bytes     int64
	oldest    time.Time // when the oldest record held reached Kafka
	// marks are watermarks received and not yet applied, in order; bounds
	// is, per table topic partition, the end offset as of the last one.
	marks  []mark
	bounds map[string]map[int32]int64

	synced time.Time
	// schemaNext is where the last look at the schema topic left it.
	schemaNext kafka.Position
	// flight is the batch being applied beside the loop (nil: none).
	flight    *flight
	trimmed   time.Time
	stateCopy *change.SourceState
	// stateSaved is set whenever the source saves its state (a copy's
	// progress, a resync): the warehouse's copy follows it.
	stateSaved atomic.Bool
	// applied is the end LSN of the last consistent batch, or of a
	// watermark past it with nothing to apply (a heartbeat): the source
	// confirms the slot no further. seq is the source position silver is
	// at as of the same (the batch being applied included), and idleEnd
	// the end LSN of such a watermark reached while a batch is applied,
	// which applied takes once it has committed.
	applied atomic.Uint64
	seq     change.LSN
	idleEnd change.LSN
	// splitting is the position of a transaction being applied in parts
	// (a split mark was taken), 0 if none; splitDone, that no partition
	// has more of it to bring, so none need wait for the others.
	splitting change.LSN
	splitDone bool
	cut       map[kafka.TopicPartition]bool // sort's
	// last is, per table partition, the position of the newest record
	// fetched (partitions hold their events in position order).
	last map[kafka.TopicPartition]change.LSN
	// savedBounds are the bounds the warehouse holds (Batch.Bounds);
	// reset, the topics whose log was read again from its start.
	savedBounds map[string]map[int32]int64
	reset       map[string]bool
	// strays are records of the meta topics that lakeflow did not write:
	// the next batch keeps them as dead letters.
	strays []warehouse.DeadLetter
	stats  consumerStats
	// checks delivers the results of scheduled checks (lakeflow.checks),
	// recorded while idle; nil when none are scheduled.
	checks <-chan checkRun
	// keep bounds the bookkeeping tables, pruned once an hour between
	// batches (pruned: when last).
	keep   config.Bookkeeping
	pruned time.Time
	// lake configures the lake's compaction, which lakeflow run --follow
	// does a table-day at a time between batches, next at compactAt (a
	// lake.compact_interval after the start: a short run leaves it).
	lake      config.Lake
	compactAt time.Time
	// compactAfter is the table the last pass merged a day of.
	compactAfter string
	// edits delivers edited contracts (lakeflow run --follow): the
	// warehouse's rules follow them between batches.
	edits chan contracts.Set
	// contracts are the ones the warehouse's rules follow.
	contracts contracts.Set
	// pub publishes the warehouse between batches (nil: never).
	pub *publisher
	// metrics, if set, are exposed to Prometheus.
	metrics *metrics
}

// mark is a received watermark with the bounds it sets.
type mark struct {
	w      change.Watermark
	offset int64 // in the watermark topic
	bounds map[string]map[int32]int64
}

type consumerStats struct {
	events, batches, files, quarantined, dead atomic.Int64
	// phases sums the batches' time per phase (the consumer's goroutine
	// alone writes it; read once it has stopped).
	phases warehouse.BatchStats
}

func (c *consumer) wmTopic() string { return kafka.WatermarkTopic(c.kcfg.Prefix) }

// run consumes until ctx is cancelled (then applies what it holds and
// returns ctx's error) or, without follow, until the source has finished
// and everything it produced is applied.
func (c *consumer) run(ctx context.Context) error {
	err := c.loop(ctx)
	// Whatever ended the loop, the batch being applied ends first, and
	// its failure is the run's: the loop's error may be the cancel or
	// Kafka's, which would hide that records were spent.
	if serr := c.settle(context.WithoutCancel(ctx)); serr != nil {
		if err != nil {
			c.log.Warn("the consumer stopped while a batch failed", "err", err)
		}
		err = serr
	}
	return err
}

// statement is ctx for one of the consumer's statements on the
// warehouse: a cancel does not interrupt it. Each is short, and the loop
// takes a cancel between them; an interrupted one can leave DuckDB's
// database open after the warehouse is closed, so that opening the file
// again in the same process waits for ever (the instance-cache spin of
// duckdb/duckdb#25965: seen in tests that stop a consumer and read its
// warehouse).
func statement(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// loop consumes as run says, and may return while a batch is still being
// applied: run waits for it.
func (c *consumer) loop(ctx context.Context) error {
	stage.Enter(stage.Fetch)
	c.committed, c.seen = map[string]warehouse.TopicPosition{}, map[string]warehouse.TopicPosition{}
	c.bounds = map[string]map[int32]int64{}
	c.last = map[kafka.TopicPartition]change.LSN{}
	c.savedBounds, c.reset = map[string]map[int32]int64{}, map[string]bool{}
	if err := c.syncSchemas(ctx); err != nil {
		return err
	}
	if err := c.assign(ctx, c.wmTopic(), 1); err != nil {
		return err
	}
	var target map[string]map[int32]int64
	sourceDone := c.sourceDone
	for {
		if ctx.Err() != nil {
			return c.finish(ctx.Err())
		}
		if target == nil && sourceDone != nil && !c.follow {
			select {
			case <-sourceDone:
				// The source has delivered everything: read where Kafka
				// ends now and stop once that is applied.
				sourceDone = nil
				if err := c.syncSchemas(ctx); err != nil {
					return err
				}
				var err error
				if target, err = c.kafka.EndOffsets(ctx, append(c.wh.Topics(), c.wmTopic())); err != nil {
					return err
				}
			default:
			}
		}
		if target != nil && len(c.pending) == 0 && len(c.marks) == 0 && reached(c.seen, target) {
			if err := c.settle(ctx); err != nil {
				return err
			}
			return c.wh.RefreshDue(statement(ctx), true)
		}
		// Between batches: the scheduled checks' results that arrived,
		// edited contracts, the bookkeeping's pruning, a compaction pass
		// and the published copy when they are due. The batch being
		// applied ends first when one waits for it.
		var err error
		if f := c.flight; f != nil && (f.landed() || c.waitsBetween()) {
			err = c.settle(ctx)
		}
		if err == nil && c.flight == nil {
			err = c.takeContracts(ctx)
		}
		if err == nil && c.flight == nil && c.pruneDue() {
			err = c.prune(ctx)
		}
		if err == nil && c.flight == nil && c.compactDue() {
			err = c.compact(ctx)
		}
		if err == nil && c.flight == nil {
			err = c.recordChecks(ctx)
			if err == nil {
				err = c.pub.due(ctx, c.kafka.Behind())
			}
		}
		if err != nil {
			if ctx.Err() != nil && !final(err) {
				return c.finish(ctx.Err())
			}
			return err
		}
		// New tables show up in the schema topic. A batch reads it first;
		// when none has run for batch_interval, look here, records held
		// or not: held records may make no batch until a table not read
		// yet adds its own (a snapshot's first tables, held short of
		// batch_bytes, wait for the next one's rows, and no watermark
		// names that table until the snapshot ends). Gold marts refreshed
		// at an interval come due: refresh them while idle.
		if time.Since(c.synced) >= c.cfg.BatchInterval {
			err := c.syncSchemas(ctx)
			if err == nil && len(c.pending) == 0 && c.flight == nil {
				err = c.wh.RefreshDue(statement(ctx), false)
			}
			if err != nil {
				if ctx.Err() != nil && !final(err) {
					return c.finish(ctx.Err())
				}
				return err
			}
		}
		// Records held wait at most until their batch is due; once it is,
		// for the watermark that ends it, which Poll returns as soon as
		// it arrives (waiting less would only spin). While a batch is
		// being applied, the loop looks in soon after it ends.
		wait := c.cfg.BatchInterval
		if left := c.cfg.BatchInterval - c.age(); len(c.pending) > 0 && left > 0 {
			wait = left
		}
		if c.flight != nil {
			wait = min(wait, flightPoll)
		}
		recs, err := c.kafka.Poll(ctx, c.cfg.BatchEvents, wait)
		if err != nil {
			if ctx.Err() != nil {
				return c.finish(ctx.Err())
			}
			return err
		}
		unknown := false
		for _, r := range recs {
			c.seen[r.Topic].Next[r.Partition] = r.Offset + 1
			if r.Topic == c.wmTopic() {
				if c.addMark(r) {
					unknown = unknown || !c.assigned(c.marks[len(c.marks)-1].bounds)
				}
				continue
			}
			rec := warehouse.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Value: r.Value, Arrived: arrival(r.Timestamp)}
			if seq, ok := change.PeekSeq(r.Value); ok {
				rec.Seq = seq
				c.last[kafka.TopicPartition{Topic: r.Topic, Partition: r.Partition}] = seq
			}
			if len(c.pending) == 0 || rec.Arrived.Before(c.oldest) {
				c.oldest = rec.Arrived
			}
			c.pending = append(c.pending, rec)
			c.bytes += int64(len(r.Value))
		}
		if c.metrics != nil {
			c.metrics.pending.Set(float64(len(c.pending)))
			for topic, n := range c.kafka.Lag() {
				c.metrics.lag.WithLabelValues(topic).Set(float64(n))
			}
		}
		if unknown {
			// A watermark names a table whose schema arrived after the
			// last look at the schema topic.
			if err := c.syncSchemas(ctx); err != nil {
				if ctx.Err() != nil && !final(err) {
					return c.finish(ctx.Err())
				}
				return err
			}
		}
		c.pace()
		if err := c.step(ctx, target); err != nil {
			if ctx.Err() != nil && !final(err) {
				return c.finish(ctx.Err())
			}
			return err
		}
	}
}

// spentError is a batch that failed after its records were released: it
// cannot be applied again from them, and nothing after it may be applied
// before it; the next start reads them from Kafka again.
type spentError struct{ error }

func (e spentError) Unwrap() error { return e.error }

// final says whether err ends the run even while it is being cancelled,
// where the consumer would otherwise apply what it holds: a batch that
// committed without its lake files published (applying it again would
// overwrite its staged files), or one whose records are spent.
func final(err error) bool {
	var spent spentError
	return errors.Is(err, warehouse.ErrUnpublished) || errors.As(err, &spent)
}

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

// finish applies, under a fresh, bounded context, the records held up to
// the newest watermark whose records have all arrived; the rest are read
// again at the next start (no batch is made without a watermark).
func (c *consumer) finish(cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	for {
		k, _ := c.ready()
		if k < 0 {
			break
		}
		m := &c.marks[k]
		if n, _ := c.held(m); n == 0 && c.idles(m) {
			c.idle(m)
			continue
		}
		if err := c.apply(ctx, m); err != nil {
			return err
		}
	}
	if err := c.settle(ctx); err != nil {
		return err
	}
	return cause
}

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

// trim deletes committed records from Kafka now and then (kafka.Trim).
func (c *consumer) trim(ctx context.Context) {
	if time.Since(c.trimmed) < trimInterval {
		return
	}
	c.trimmed = time.Now()
	committed := map[string]map[int32]int64{}
	for topic, pos := range c.committed {
		if topic != kafka.SchemaTopic(c.kcfg.Prefix) {
			committed[topic] = pos.Next
		}
	}
	if n, err := c.kafka.Trim(ctx, committed); err != nil {
		c.log.Warn("trimming Kafka failed; retrying later", "err", err)
	} else if n > 0 {
		c.log.Debug("kafka trimmed", "records", n)
	}
}

// syncSchemas creates or evolves silver tables from new schema records,
// keeps a copy of the source's state, and starts consuming new topics at
// the warehouse's positions.
func (c *consumer) syncSchemas(ctx context.Context) error {
	c.synced = time.Now()
	topic := kafka.SchemaTopic(c.kcfg.Prefix)
	// Look at the schema topic alone first: the warehouse is busy with
	// a batch, or an idle pipeline looks every batch_interval, where a
	// statement each time was most of what idling cost. Only when it
	// has moved, wait for the batch and read from the warehouse's
	// position.
	recs, strays, _, reset, err := c.kafka.Schemas(ctx, c.schemaNext)
	if err != nil {
		return err
	}
	// (The first look reads the warehouse's position, and assigns the
	// topics it knows, whatever the schema topic holds.)
	moved := len(recs)+len(strays) > 0 || reset || c.schemaNext.Next == nil
	stale := c.stateSaved.Swap(false) || c.stateCopy == nil || !c.stateCopy.Snapshotted || c.stateCopy.Slot != c.slot
	if !moved && stale {
		// During a snapshot: has the source's state moved on?
		state, _, err := c.kafka.SourceState(ctx)
		if err != nil {
			return err
		}
		moved = state != nil && (c.stateCopy == nil || !equalState(state, c.stateCopy))
	}
	if !moved {
		return nil
	}
	if err := c.settle(ctx); err != nil {
		return err
	}
	from, err := c.wh.Offsets(statement(ctx), topic)
	if err != nil {
		return err
	}
	recs, strays, next, reset, err := c.kafka.Schemas(ctx, kafka.Position(from))
	if err != nil {
		return err
	}
	var dead []warehouse.DeadLetter
	for _, st := range strays {
		c.log.Warn("a record lakeflow did not write is set aside as a dead letter", "topic", st.Topic, "offset", st.Offset, "reason", st.Reason)
		dead = append(dead, deadStray(st))
	}
	c.schemaNext = next
	if reset {
		c.log.Warn("the schema topic was deleted or reset; reading it again from its start", "topic", topic)
	}
	var state *change.SourceState
	if stale {
		if state, _, err = c.kafka.SourceState(ctx); err != nil {
			return err
		}
		if state != nil && c.stateCopy != nil && equalState(state, c.stateCopy) {
			state = nil
		}
	}
	if len(recs)+len(dead) > 0 || state != nil || reset {
		schemas := make([]warehouse.Schema, len(recs))
		for i, r := range recs {
			schemas[i] = warehouse.Schema{Topic: r.Topic, Table: r.Table}
		}
		if err := c.wh.ApplySchemas(statement(ctx), schemas, topic, warehouse.TopicPosition(next), state, dead); err != nil {
			return err
		}
		if len(dead) > 0 {
			c.deadLetters(ctx, dead)
		}
		if state != nil {
			c.stateCopy = state
		}
	}
	for _, t := range c.wh.Topics() {
		if err := c.assign(ctx, t, c.kcfg.Partitions); err != nil {
			return err
		}
	}
	return nil
}

func equalState(a, b *change.SourceState) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// assign starts consuming topic at the warehouse's position. When the
// log the warehouse read is gone (Kafka's data was deleted, or the topic
// is new to it under a new prefix), it reads the present log from its
// start and the warehouse recognises what it holds by event position.
func (c *consumer) assign(ctx context.Context, topic string, partitions int) error {
	if c.kafka.Assigned(topic) {
		return nil
	}
	stored, err := c.wh.Offsets(statement(ctx), topic)
	if err != nil {
		return err
	}
	// Watermarks are hints: one trimmed before the warehouse read it
	// (a warehouse rebuilt from the lake) bounded only records the
	// warehouse holds.
	from, reset, err := c.kafka.Assign(ctx, topic, partitions, kafka.Position(stored), topic == c.wmTopic())
	if err != nil {
		return err
	}
	if reset {
		c.log.Warn("the Kafka log the warehouse read is gone (its data was deleted or reset); reading the present one from its start, skipping the events the lake and silver hold",
			"topic", topic, "warehouse_at", c.wh.Floor())
	}
	if topic != c.wmTopic() {
		if err := c.wh.ReadingTopic(statement(ctx), topic, from.ID); err != nil {
			return err
		}
	}
	pos := warehouse.TopicPosition(from)
	c.committed[topic], c.seen[topic] = clonePosition(pos), clonePosition(pos)
	for tp := range c.last {
		if tp.Topic == topic {
			delete(c.last, tp) // a position an earlier log of the topic reported
		}
	}
	if reset {
		c.reset[topic] = true
	}
	if topic == c.wmTopic() {
		// Watermarks not yet read leave each partition where the last
		// batch that ended at a mark left its bound (a batch takes the
		// records up to its mark's position: its bounds may hold later
		// ones, which a later batch takes).
		for t, p := range c.committed {
			if t == c.wmTopic() {
				continue
			}
			c.bounds[t] = maps.Clone(p.Next)
			if c.reset[t] {
				continue // the bounds of a log that is gone
			}
			stored, err := c.wh.Bounds(statement(ctx), t)
			if err != nil {
				return err
			}
			for part, b := range stored {
				c.bounds[t][part] = max(c.bounds[t][part], b)
			}
			c.savedBounds[t] = stored
		}
		c.marks = nil
	} else if reset || c.bounds[topic] == nil {
		// A watermark read before the topic was assigned knows better.
		c.bounds[topic] = maps.Clone(pos.Next)
	}
	return nil
}

func clonePosition(p warehouse.TopicPosition) warehouse.TopicPosition {
	return warehouse.TopicPosition{ID: p.ID, Next: maps.Clone(p.Next)}
}

// reached reports whether positions are at or past target everywhere.
func reached(pos map[string]warehouse.TopicPosition, target map[string]map[int32]int64) bool {
	for topic, parts := range target {
		for p, end := range parts {
			if pos[topic].Next[p] < end {
				return false
			}
		}
	}
	return true
}

// takeContracts gives the warehouse edited contracts, if any came: the
// rules of the batches from now on are theirs.
func (c *consumer) takeContracts(ctx context.Context) error {
	select {
	case set := <-c.edits:
		err := c.wh.SetContracts(statement(ctx), set)
		if err == nil {
			c.contracts = set
			if c.metrics != nil {
				c.metrics.contracts(set)
			}
			return nil
		}
		// A rule the edit wrote that silver cannot run: said, and the
		// run goes on under the rules before (the next start refuses the
		// contract, naming it).
		c.log.Error("the edited contracts' rules cannot run on silver: the rules before stay in force", "err", fault.OneLine(err.Error()))
		return c.wh.SetContracts(statement(ctx), c.contracts)
	default:
		return nil
	}
}

// waitsBetween says whether work that runs between batches is due, for
// which the batch being applied must end first: under a steady load the
// next batch is staged and applied as soon as the last ends, so without
// that wait a due compaction pass or pruning never found a moment (an
// aging run at 5,000 changes/s left a table-day of 1,196 files).
func (c *consumer) waitsBetween() bool {
	f := c.flight
	return len(c.checks) > 0 || len(c.edits) > 0 || c.pruneDue() || c.compactDue() ||
		(f != nil && c.pub.waiting(c.kafka.Behind(), f.batch.Watermark != nil))
}

// pruneDue says whether the bookkeeping tables are to be pruned.
func (c *consumer) pruneDue() bool { return time.Since(c.pruned) >= pruneInterval }

// compactDue says whether a compaction pass of run --follow is due.
func (c *consumer) compactDue() bool {
	return c.follow && c.lake.CompactInterval > 0 && time.Now().After(c.compactAt)
}

// pruneInterval is how often the bookkeeping tables are pruned.
const pruneInterval = time.Hour

// prune bounds the bookkeeping tables (config.Bookkeeping).
func (c *consumer) prune(ctx context.Context) error {
	c.pruned = time.Now()
	p, err := c.wh.Prune(statement(ctx), c.keep, c.pruned)
	if err != nil {
		// Only bookkeeping waits: the changes go on, the next hour
		// tries again (a stop here would recur at every start).
		c.log.Error("pruning the bookkeeping tables failed; they keep their rows until the next try", "err", fault.OneLine(err.Error()), "next", pruneInterval)
		return nil
	}
	if p.Batches+p.Runs+p.Checks > 0 {
		c.log.Info("bookkeeping pruned", "batches_summarized", p.Batches, "runs", p.Runs, "checks", p.Checks)
	}
	// The files compactions replaced go once their grace has passed, also
	// with run --follow's compaction off (lakeflow compact's, then).
	if n, err := c.wh.RemoveCompacted(statement(ctx), c.lake.CompactGrace); err != nil {
		c.log.Error("removing the files compactions replaced failed; they stay until the next try", "err", fault.OneLine(err.Error()), "next", pruneInterval)
	} else if n > 0 {
		c.log.Info("files compactions replaced removed", "compactions", n)
	}
	return nil
}

// compactBusy spaces lakeflow run --follow's compaction passes while
// table-days are left to merge: batches keep the time between.
const compactBusy = 10 * time.Second

// compact runs a pass of lakeflow run --follow's compaction between two
// batches: one table-day's small files (today's so far among them), up
// to a merged file's worth; the next pass compactBusy later while files
// are left to merge, a lake.compact_interval later once none is.
func (c *consumer) compact(ctx context.Context) error {
	c.compactAt = time.Now().Add(c.lake.CompactInterval)
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	st, err := c.wh.Compact(statement(ctx), warehouse.CompactOptions{Before: tomorrow,
		Target: c.lake.CompactTarget, Grace: c.lake.CompactGrace, MaxDays: 1, MaxBytes: c.lake.CompactTarget, Incremental: true, After: c.compactAfter})
	if st.Last != "" {
		c.compactAfter = st.Last // the next pass begins with the tables after it
	}
	if errors.Is(err, warehouse.ErrSwapUnfinished) {
		// The warehouse names merged files the lake does not hold yet:
		// the next start swaps them in before anything writes the lake.
		return err
	}
	if err != nil {
		// The lake stays as it was (a day built and not recorded is
		// removed): the changes go on, and the next pass tries again.
		c.log.Error("lake compaction failed: the lake keeps its small files until a later pass", "err", fault.OneLine(err.Error()), "next", c.lake.CompactInterval)
		return nil
	}
	if st.More {
		c.compactAt = time.Now().Add(compactBusy)
	}
	if st.Days > 0 {
		c.log.Info("lake compacted", "files_merged", st.Replaced, "files_written", st.Written)
	}
	return nil
}
