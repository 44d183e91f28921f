package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/stage"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// finishTimeout bounds what is left after a cancel: reading the schemas
// and staging the records held (a batch once staged runs to its end:
// warehouse.ApplyStaged).
const finishTimeout = time.Minute

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
	// workload: a workload makes changes while the run reads them and
	// shows them applied (the demo's, Options.Show), so batches close by
	// age, as under follow, not only when full.
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
			c.metrics.lagged(c.kafka.Lag())
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
