// Package pipeline is the run loop: it starts what the configuration asks
// for (embedded PostgreSQL and Kafka), then runs the source (PostgreSQL →
// Kafka) and the consumer (Kafka → lake + warehouse) side by side.
package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/warehouse"
)

// Options are the run modes.
type Options struct {
	// Follow keeps running until ctx is cancelled; otherwise Run drains
	// the WAL up to its end (after the demo workload, if any) and returns.
	Follow bool
	// Workload, if set, runs against the source once the snapshot is taken
	// and the stream runs; without Follow, the drain waits for it.
	Workload func(ctx context.Context, dsn string) error
	// Show applies the workload's changes as they are made, in batches
	// closed by age as --follow's are (the demo: its batches are the
	// positions asof travels between); a run without it fills batches
	// while it drains.
	Show bool
	// Prepare, if set, runs against the source before capture starts.
	Prepare func(ctx context.Context, dsn string) error
	// Progress, if set, gets a one-line progress display (a terminal).
	Progress io.Writer
	// MetricsAddr, if set, is where Prometheus metrics are served
	// (/metrics; a port alone binds loopback).
	MetricsAddr string
}

// Run runs the pipeline. Cancelling ctx (Ctrl-C) finishes the in-flight
// batch and returns nil.
func Run(ctx context.Context, cfg *config.Config, opts Options, log *slog.Logger) error {
	set, err := loadContracts(cfg, log)
	if err != nil {
		return err
	}
	// The marts' files and gold.refresh, before anything starts.
	marts, err := loadMarts(cfg)
	if err != nil {
		return err
	}
	var metricsLn net.Listener
	if opts.MetricsAddr != "" {
		if metricsLn, err = listenMetrics(opts.MetricsAddr); err != nil {
			return err
		}
		defer func() {
			if metricsLn != nil { // not served: the server closes it once ctx ends
				metricsLn.Close()
			}
		}()
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	defer limitGoHeap(cfg, log)()

	env, err := startEnvironment(ctx, cfg, true, log)
	defer env.stop(log)
	if err != nil {
		return err
	}
	if opts.Prepare != nil {
		if err := opts.Prepare(ctx, env.dsn); err != nil {
			return err
		}
	}
	wh, err := openRunWarehouse(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer wh.Close()
	pub := &publisher{wh: wh, path: cfg.Warehouse.Path, interval: cfg.Warehouse.PublishInterval, log: log}
	defer pub.wait() // before the warehouse closes
	if err := wh.SetContracts(ctx, set); err != nil {
		return err
	}
	if err := giveMarts(ctx, cfg, wh, marts); err != nil {
		return err
	}
	k, err := connectKafka(ctx, cfg, env, wh, log)
	defer k.close()
	if err != nil {
		return err
	}
	kcfg, cons, prod, sg, fallback := k.cfg, k.cons, k.prod, k.signing, k.fallback
	drain := make(chan struct{})
	if !opts.Follow && opts.Workload == nil {
		close(drain)
	}
	sourceDone := make(chan struct{})
	c := &consumer{cfg: cfg.Pipeline, keep: cfg.Bookkeeping, lake: cfg.Lake, contracts: set, kcfg: kcfg, slot: cfg.Source.Slot, kafka: cons, wh: wh, log: log,
		follow: opts.Follow, workload: opts.Show && opts.Workload != nil, compactAt: time.Now().Add(cfg.Lake.CompactInterval), sourceDone: sourceDone, stateCopy: fallback.Clone(), seq: wh.Floor(), splitting: wh.OpenTransaction(), strays: sg.strays}
	if opts.Follow && cfg.Check.Interval > 0 {
		c.checks = scheduleChecks(ctx, cfg, log)
	}
	c.pub = pub
	if metricsLn != nil {
		c.metrics = newMetrics(wh)
		if fi, err := os.Stat(cfg.Warehouse.Path); err == nil {
			c.metrics.published.Store(fi.ModTime().UnixNano()) // the copy readers have
		}
		pub.metrics = c.metrics
		c.metrics.serve(ctx, metricsLn, log)
		metricsLn = nil
	}
	applied, err := wh.AppliedEnd(ctx)
	if err != nil {
		return err
	}
	c.applied.Store(uint64(applied))
	resyncs := newResyncWatch(cfg.DataDir, log)
	requests := resyncs.initial()
	var edits chan contracts.Set
	if opts.Follow {
		edits, c.edits = make(chan contracts.Set, 1), make(chan contracts.Set, 1)
	}
	src := postgres.NewSource(postgres.SourceConfig{
		DSN: env.dsn, Tables: cfg.Source.Tables, Slot: cfg.Source.Slot,
		Publication: cfg.Source.Publication, Heartbeat: cfg.Source.Heartbeat,
		Applied:   func() change.LSN { return change.LSN(c.applied.Load()) },
		Delivered: wh.Floor(),
		Fallback:  fallback, FallbackSchemas: wh.Schemas(),
		Contracts: set, Key: sg.key,
		Resyncs: requests, ContractEdits: edits,
	}, log)
	if c.metrics != nil {
		c.metrics.reg.MustRegister(parkedCollector(src.Parked, tableNames(cfg.Source.Tables)))
		c.metrics.source(&src.Stats)
		c.metrics.contracts(set)
	}

	started := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(sourceDone)
		return src.Run(gctx, prod, savesNoted{prod, &c.stateSaved}, drain)
	})
	if opts.Follow {
		g.Go(func() error {
			resyncs.watch(gctx, requests)
			return nil
		})
		g.Go(func() error {
			watchContracts(gctx, cfg, log, edits, c.edits)
			return nil
		})
		if cfg.Lake.CheckpointInterval > 0 {
			g.Go(func() error {
				checkpointEvery(gctx, cfg, log)
				return nil
			})
		}
	}
	if opts.Workload != nil {
		g.Go(func() error {
			select {
			case <-gctx.Done():
				return nil
			case <-src.Streaming():
			}
			err := opts.Workload(gctx, env.dsn)
			if !opts.Follow {
				close(drain)
			}
			return err
		})
	}
	var consumed error
	g.Go(func() error {
		consumed = c.run(gctx)
		return consumed
	})
	if opts.Progress != nil {
		stop := showProgress(opts.Progress, src, c)
		defer stop()
	}
	err = g.Wait()
	if final(consumed) {
		// A batch failed in a way that stops the run even while it is
		// stopping: the user must hear it, not the cancellation that may
		// have reached the source first.
		err = consumed
	}
	return endRun(ctx, cfg, opts, c, src, prod, pub, started, err, log)
}

// endRun ends a run whose parts stopped with err: the final copy's marts,
// the run's record, the slot confirmed as far as the warehouse applied
// (a run without --follow), the final copy, and what the parked tables
// wait for.
func endRun(ctx context.Context, cfg *config.Config, opts Options, c *consumer, src *postgres.Source, prod *kafka.Producer, pub *publisher, started time.Time, err error, log *slog.Logger) error {
	interrupted := errors.Is(err, context.Canceled) && ctx.Err() != nil
	if err == nil || interrupted {
		// The final copy's marts, before the run's record, which counts
		// them.
		if rerr := pub.refresh(context.WithoutCancel(ctx)); rerr != nil {
			err, interrupted = rerr, false
		}
	}
	if rerr := c.recordRun(ctx, started, opts.Follow, err, interrupted); rerr != nil {
		log.Warn("the run was not recorded in lakeflow.runs", "err", rerr)
	}
	if interrupted {
		log.Info("stopped")
		return pub.final(ctx)
	}
	if err != nil {
		return err
	}
	if !opts.Follow {
		// The stream stopped at the WAL's end before the warehouse
		// caught up: confirm what it has applied since.
		if err := src.ConfirmStopped(ctx, prod); err != nil {
			log.Warn("the slot stays where the stream left it: the next start reads the WAL from there again", "err", err)
		}
	}
	if parked := src.Parked(); len(parked) > 0 && !opts.Follow {
		// The other tables are applied; the run says what holds these.
		if err := pub.final(ctx); err != nil {
			return err
		}
		reasons := make([]string, len(parked))
		for i, p := range parked {
			reasons[i] = p.Stop() + " (the other tables went on)"
		}
		return fmt.Errorf("%w: %s", fault.ErrSchemaBreak, strings.Join(reasons, "; "))
	}
	if err := pub.final(ctx); err != nil {
		return err
	}
	log.Info("run complete", "events", c.stats.events.Load(), "batches", c.stats.batches.Load(),
		"lake_files", c.stats.files.Load(), "warehouse", cfg.Warehouse.Path)
	return nil
}

// openRunWarehouse opens the live warehouse for a run (made from the
// published one if it is missing), its gold refreshed as of each copy,
// numbering batches after what the lake holds.
func openRunWarehouse(ctx context.Context, cfg *config.Config, log *slog.Logger) (*warehouse.Warehouse, error) {
	lk, err := lake.Open(cfg.Lake.Dir)
	if err != nil {
		return nil, err
	}
	if err := ensureLive(cfg, log); err != nil {
		return nil, err
	}
	wh, err := openLive(ctx, cfg, lk, log, runMemoryLimit, runThreads())
	if err != nil {
		return nil, err
	}
	wh.DeferGold() // refreshed as of each copy (Warehouse.Copy.Publish)
	if err := wh.NumberAfterLake(ctx); err != nil {
		wh.Close()
		return nil, err
	}
	return wh, nil
}

// kafkaClients are a run's Kafka consumer and producer, and what they
// agreed with the warehouse: the records' signing, and the copy of the
// source's state a source whose Kafka data is gone resumes from (nil
// once Kafka holds one).
type kafkaClients struct {
	cfg      kafka.Config
	cons     *kafka.Consumer
	prod     *kafka.Producer
	signing  signing
	fallback *change.SourceState
}

// connectKafka makes a run's Kafka clients; close closes those made,
// whatever it returned.
func connectKafka(ctx context.Context, cfg *config.Config, env *environment, wh *warehouse.Warehouse, log *slog.Logger) (*kafkaClients, error) {
	k := &kafkaClients{cfg: kafka.Config{
		Brokers: env.brokers, Prefix: cfg.Kafka.TopicPrefix, Partitions: cfg.Kafka.Partitions,
		Retention: cfg.Kafka.Retention, RetentionBytes: cfg.Kafka.RetentionBytes, Database: env.database,
	}}
	var err error
	if k.cons, err = kafka.NewConsumer(k.cfg); err != nil {
		return k, err
	}
	// What the warehouse holds decides where a source whose Kafka data
	// is gone resumes, and how far the slot may be confirmed.
	if k.fallback, err = wh.SourceState(ctx); err != nil {
		return k, err
	}
	if k.signing, err = establishSigning(ctx, k.cons, wh, k.fallback, log); err != nil {
		return k, err
	}
	k.cfg.Signer = k.signing.signer
	if k.prod, err = kafka.NewProducer(k.cfg, log); err != nil {
		return k, err
	}
	if k.signing.introduced != nil {
		if err := k.prod.SaveState(ctx, *k.signing.introduced); err != nil {
			return k, err
		}
		k.fallback = nil // the consumer copies the new state into the warehouse
	}
	return k, nil
}

// close closes the clients made, the producer first.
func (k *kafkaClients) close() {
	if k.prod != nil {
		k.prod.Close()
	}
	if k.cons != nil {
		k.cons.Close()
	}
}

// savesNoted is the producer as the source's state store, noting each
// save for the consumer, whose warehouse keeps a copy of the state.
type savesNoted struct {
	*kafka.Producer
	saved *atomic.Bool
}

func (s savesNoted) SaveState(ctx context.Context, st change.SourceState) error {
	err := s.Producer.SaveState(ctx, st)
	s.saved.Store(true)
	return err
}

// recordRun appends the run to lakeflow.runs: what it did, per-phase
// time, and how it ended.
func (c *consumer) recordRun(ctx context.Context, started time.Time, follow bool, err error, interrupted bool) error {
	reason := "done"
	switch {
	case interrupted:
		reason = "interrupted"
	case err != nil:
		reason = "error: " + strings.Join(strings.Fields(err.Error()), " ")
	}
	s := &c.stats
	phases := s.phases
	phases.Gold += c.pub.gold
	return c.wh.RecordRun(context.WithoutCancel(ctx), warehouse.Run{Started: started, Ended: time.Now(), Follow: follow,
		Events: s.events.Load(), Batches: s.batches.Load(), LakeFiles: s.files.Load(), Quarantined: s.quarantined.Load(), Dead: s.dead.Load(),
		Phases: phases, ExitReason: reason})
}

// openLive opens the live warehouse (warehouse.live_path), with DuckDB's
// memory capped at limit and threads worker threads unless
// warehouse.memory_limit and warehouse.threads say (0: the warehouse's
// defaults).
func openLive(ctx context.Context, cfg *config.Config, lk *lake.Lake, log *slog.Logger, limit int64, threads int) (*warehouse.Warehouse, error) {
	wcfg := cfg.Warehouse
	wcfg.Path = wcfg.Live
	wcfg.MemoryLimit = cmp.Or(wcfg.MemoryLimit, limit)
	wcfg.Threads = cmp.Or(wcfg.Threads, threads)
	return warehouse.Open(ctx, wcfg, lk, log)
}

// environment is what Run started for the configuration.
type environment struct {
	cluster  *postgres.Cluster
	broker   *kafka.Broker
	dsn      string
	database string
	brokers  []string
}

// startEnvironment starts the embedded PostgreSQL and, with withKafka, the
// embedded broker, as the configuration asks.
func startEnvironment(ctx context.Context, cfg *config.Config, withKafka bool, log *slog.Logger) (*environment, error) {
	env := &environment{dsn: cfg.Source.DSN, brokers: cfg.Kafka.Brokers}
	if env.dsn == "" {
		e := cfg.Source.Embedded
		cl, err := postgres.StartCluster(ctx, postgres.ClusterConfig{Dir: e.Dir, Port: e.Port}, log)
		if err != nil {
			return env, err
		}
		env.cluster = cl
		if err := cl.EnsureDatabase(ctx, e.Database); err != nil {
			return env, err
		}
		env.dsn = cl.DSN(e.Database)
	}
	db, err := postgres.DatabaseName(env.dsn)
	if err != nil {
		return env, err
	}
	env.database = db
	if withKafka && cfg.Kafka.Embedded() {
		b, err := kafka.StartBroker(cfg.Kafka.Dir, cfg.Kafka.Listen, log)
		if err != nil {
			return env, err
		}
		env.broker = b
		env.brokers = []string{b.Addr()}
	}
	return env, nil
}

func (e *environment) stop(log *slog.Logger) {
	if e.broker != nil {
		e.broker.Close()
	}
	if e.cluster != nil {
		if err := e.cluster.Stop(); err != nil {
			log.Warn("stopping embedded postgres failed", "err", fmt.Sprint(err))
		}
	}
}

// loadContracts loads the contracts of contracts.dir and checks that an
// existence rule names a captured table. A contract of a table that is
// not captured is left alone, with a warning (a misspelt table would
// otherwise leave its rules silently unused).
func loadContracts(cfg *config.Config, log *slog.Logger) (contracts.Set, error) {
	set, err := contracts.Load(cfg.Contracts.Dir)
	if err != nil {
		return nil, err
	}
	captured := map[string]bool{}
	silver := map[string]string{} // DuckDB ignores case
	for _, t := range cfg.Source.Tables {
		captured[t.String()] = true
		silver[strings.ToLower(t.Name)] = t.String()
	}
	var problems []string
	for id, c := range set {
		if !captured[id] {
			log.Warn("contract of a table that is not captured (not in source.tables): its rules do not run", "contract", c.File, "table", id)
			continue
		}
		if other, ok := silver[strings.ToLower(c.Table.Name+"_history")]; ok && c.History {
			problems = append(problems, fmt.Sprintf("%s: history = true needs silver.%s_history for its history, but the captured table %s has that name; set history = false, or capture only one of them",
				c.File, c.Table.Name, other))
		}
		for _, r := range c.Rules {
			if r.References != nil && !captured[r.References.Table.String()] {
				problems = append(problems, fmt.Sprintf("%s: rule %s references %s, which is not in source.tables", c.File, r.Name, r.References.Table))
			}
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", fault.ErrConfig, strings.Join(problems, "; "))
	}
	return set, nil
}
