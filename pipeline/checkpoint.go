package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/warehouse"
)

// checkpointsKept is how many state checkpoints the lake keeps: the
// newest, and the one before for an as-of position between the two.
const checkpointsKept = 2

// lakeEnd is the position after every event: the lake's latest state.
const lakeEnd = "FFFFFFFF/FFFFFFFF"

// noEventsError is the error of a lake that holds no event yet.
type noEventsError struct{ dir string }

func (e *noEventsError) Error() string { return "the lake at " + e.dir + " holds no events yet" }

// startFromCheckpoint loads into wh, a view that holds nothing yet, the
// newest state checkpoint of the lake that fits a replay under in up to
// upto, and returns its position (0: none fits; the replay starts at the
// lake's start). A checkpoint that cannot be read is passed over, said
// in the log: it only ever saves time.
func startFromCheckpoint(ctx context.Context, cfg *config.Config, wh *warehouse.Warehouse, in warehouse.CheckpointInputs, upto change.LSN, log *slog.Logger) (change.LSN, error) {
	lk, err := lake.OpenExisting(cfg.Lake.Dir)
	if err != nil {
		return 0, err
	}
	cps, err := lk.Checkpoints()
	if err != nil {
		log.Warn("the lake's state checkpoints cannot be listed: the replay starts at the lake's start", "err", err)
		return 0, nil
	}
	for _, c := range cps {
		if c.Seq > upto {
			continue
		}
		at, unfit, err := wh.LoadCheckpoint(ctx, c.Path, in, upto)
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err != nil {
			log.Warn("a state checkpoint of the lake cannot be read: the replay passes it over", "checkpoint", c.Path, "err", fault.OneLine(err.Error()))
			continue
		}
		if unfit != "" {
			log.Debug("a state checkpoint of the lake does not fit", "checkpoint", c.Path, "why", unfit)
			continue
		}
		return at, nil
	}
	return 0, nil
}

// checkpointAt is the position a checkpoint of the lake as of bound
// holds: the lake's last event's at most (a checkpoint fits the
// positions at or after its own), and below the backlog of a table
// released from parking (newest are the tables' newest schemas) until a
// batch past it is whole (whole: the newest whole batch's position, 0:
// none): its changes are still coming, at positions the lake is past.
func checkpointAt(bound, last, whole change.LSN, newest []warehouse.Schema) change.LSN {
	at := min(bound, last)
	for _, s := range newest {
		if b := s.Table.Backlog; b != nil && whole < b.To {
			at = min(at, b.From-1)
		}
	}
	return at
}

// CheckpointStats describe a state checkpoint written.
type CheckpointStats struct {
	// Seq is its position; From the checkpoint's it started from (0: the
	// lake's start); Events how many events it replayed between.
	Seq, From change.LSN
	Events    int
	// Written is false when the lake held nothing after From.
	Written bool
	// Removed counts the older checkpoints removed.
	Removed int
	Seconds float64
}

// BuildCheckpoint writes a state checkpoint of the lake as of its last
// whole batch: the newest checkpoint that fits, and the events after it,
// replayed. It keeps the newest checkpointsKept. Only one runs at a time:
// the caller holds the data directory (lakeflow run, lakeflow compact).
func BuildCheckpoint(ctx context.Context, cfg *config.Config, log *slog.Logger) (CheckpointStats, error) {
	t0 := time.Now()
	var st CheckpointStats
	lk, err := lake.OpenExisting(cfg.Lake.Dir)
	if err != nil {
		return st, err
	}
	if st.Removed, err = pruneCheckpoints(lk); err != nil {
		return st, err
	}
	// Nothing came since the newest: building it again would cost the
	// whole state for nothing.
	if cps, err := lk.Checkpoints(); err == nil && len(cps) > 0 {
		if last, err := lk.LastSeq(); err == nil && last <= cps[0].Seq {
			return st, nil
		}
	}
	path, err := lk.BuildCheckpoint()
	if err != nil {
		return st, fmt.Errorf("%w: prepare a checkpoint in the lake: %v", fault.ErrEnvironment, err)
	}
	defer os.RemoveAll(path + ".lake") // the links it read the lake by (ReadByLinks)
	a, err := BuildAsOf(ctx, cfg, AsOfOptions{Position: lakeEnd, Out: path, checkpoint: true}, log)
	if _, ok := errors.AsType[*noEventsError](err); ok {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	st.Seq, st.From, st.Events = a.Bound.Seq, a.From, a.Stats.Events
	crash.Point(crash.CheckpointBuilt)
	if a.Bound.Seq == a.From {
		return st, os.Remove(path) // nothing new since that one
	}
	if _, err := lk.PublishCheckpoint(path, a.Bound.Seq); err != nil {
		return st, fmt.Errorf("%w: publish a checkpoint in the lake: %v", fault.ErrEnvironment, err)
	}
	st.Written = true
	removed, err := pruneCheckpoints(lk)
	st.Removed += removed
	st.Seconds = time.Since(t0).Seconds()
	return st, err
}

// pruneCheckpoints removes the checkpoints older than the newest
// checkpointsKept, unless readers of the lake hold its files (they may
// have listed them): the next build tries again.
func pruneCheckpoints(lk *lake.Lake) (int, error) {
	cps, err := lk.Checkpoints()
	if err != nil || len(cps) <= checkpointsKept {
		return 0, err
	}
	unlock, err := lk.LockSwaps(false)
	if errors.Is(err, lake.ErrReadersHold) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer unlock()
	for _, c := range cps[checkpointsKept:] {
		if err := lk.RemoveCheckpoint(c); err != nil {
			return 0, fmt.Errorf("%w: remove checkpoint %s: %v", fault.ErrEnvironment, c.Path, err)
		}
	}
	return len(cps) - checkpointsKept, nil
}

// firstCheckpointAfter is the longest run --follow waits after its
// start before its first build (less when lake.checkpoint_interval is).
const firstCheckpointAfter = 10 * time.Minute

// buildGuarded is BuildCheckpoint at the lowest CPU priority, a panic
// turned into its error: a checkpoint only ever saves time, and the
// batches go on.
func buildGuarded(ctx context.Context, cfg *config.Config, log *slog.Logger) (st CheckpointStats, err error) {
	lowPriority(func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("the build panicked: %v", r)
			}
		}()
		st, err = BuildCheckpoint(ctx, cfg, log)
	})
	return st, err
}

// checkpointBuilderMemory caps the DuckDB memory of the checkpoints run
// --follow builds beside its batches (it spills past it).
const checkpointBuilderMemory = 128 << 20

// checkpointEvery writes a state checkpoint of the lake every
// lake.checkpoint_interval while lakeflow run --follow runs (the first an
// interval after the newest one, or after the start), beside the
// batches on one DuckDB thread and checkpointBuilderMemory of its own. A
// build that fails is said in the log and tried again an interval later:
// the batches go on.
func checkpointEvery(ctx context.Context, cfg *config.Config, log *slog.Logger) {
	own := *cfg
	own.Warehouse.Threads = 1
	own.Warehouse.MemoryLimit = checkpointBuilderMemory
	every := cfg.Lake.CheckpointInterval
	// Not at once after a start: a build a kill (or the machine's memory)
	// ended would begin at every restart.
	next := time.Now().Add(min(every, firstCheckpointAfter))
	if lk, err := lake.OpenExisting(cfg.Lake.Dir); err == nil {
		if last := lk.LastBuildBegun(); last.Add(every).After(next) {
			next = last.Add(every)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		next = time.Now().Add(every)
		st, err := buildGuarded(ctx, &own, log)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Error("writing a state checkpoint of the lake failed: asof and check replay from the one before", "err", fault.OneLine(err.Error()), "next", cfg.Lake.CheckpointInterval)
		case st.Written:
			log.Info("state checkpoint written", "seq", uint64(st.Seq), "from", uint64(st.From), "events", st.Events, "removed", st.Removed, "seconds", st.Seconds)
		}
	}
}
