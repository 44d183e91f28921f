package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// BackfillOptions say what lakeflow backfill rebuilds.
type BackfillOptions struct {
	// All rebuilds the whole warehouse from the lake.
	All bool
	// From and To (days, inclusive) rebuild the rows those days changed.
	From, To time.Time
	// Mart, if set, recomputes that gold mart only (for From to To, and
	// its pending partitions), from silver.
	Mart string
	// Out, with All, writes the rebuilt warehouse there instead of
	// replacing warehouse.path.
	Out string
}

// BackfillStats says what a backfill did.
type BackfillStats struct {
	warehouse.ReplayStats
	Seconds float64
	// Adopted counts lake files lakeflow.lake_files did not list.
	Adopted int
	Path    string
	// Slice is what a backfill of days replaced; Empty says the lake held
	// nothing of the days.
	Slice warehouse.SliceStats
	Empty bool
	// Unpublished says warehouse.path keeps its copy: the live warehouse
	// ends inside a source transaction (publishWhole).
	Unpublished bool
	// From is the position of the state checkpoint a backfill of days
	// started from (0: the lake's start).
	From change.LSN
}

// replayChunk is how many events a backfill applies per transaction.
const replayChunk = 1_000_000

// Backfill rebuilds from the lake, through the stream's transforms.
func Backfill(ctx context.Context, cfg *config.Config, opts BackfillOptions, log *slog.Logger) (BackfillStats, error) {
	var st BackfillStats
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return st, fmt.Errorf("%w (lakeflow backfill does not run beside lakeflow run: stop it first)", err)
	}
	defer unlock()
	if err := ensureLive(cfg, log); err != nil {
		return st, err
	}
	if !opts.All {
		return backfillRange(ctx, cfg, opts, log)
	}
	t0 := time.Now()
	out := opts.Out
	if out == "" {
		out = cfg.Warehouse.Live + ".rebuild"
	}
	st.Path = out
	for _, p := range []string{out, out + ".wal"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return st, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
		}
	}
	if err := rebuild(ctx, cfg, out, nil, &st, log); err != nil {
		return st, err
	}
	st.Seconds = time.Since(t0).Seconds()
	if opts.Out != "" {
		return st, nil
	}
	// The old warehouse is closed (checkpointed, no WAL): the rebuilt
	// file takes its name in one rename, and is published.
	live := cfg.Warehouse.Live
	if err := os.Remove(live + ".wal"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	crash.Point(crash.Swap)
	if err := os.Rename(out, live); err != nil {
		return st, fmt.Errorf("%w: replace %s: %v", fault.ErrEnvironment, live, err)
	}
	if err := lake.Sync(filepath.Dir(live)); err != nil {
		return st, err
	}
	st.Path = cfg.Warehouse.Path
	return st, publishLive(ctx, cfg, log)
}

// publishLive publishes the live warehouse to warehouse.path.
func publishLive(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	lk, err := lake.Open(cfg.Lake.Dir)
	if err != nil {
		return err
	}
	wh, err := openLive(ctx, cfg, lk, log, 0, 0)
	if err != nil {
		return err
	}
	if err := publishWhole(ctx, wh, cfg.Warehouse.Path, log); err != nil {
		wh.Close()
		return err
	}
	return wh.Close()
}

// rebuild builds the warehouse at path from the lake: the old
// warehouse's state (where the pipeline stands, the lake's files, dead
// letters, schema versions) if it opens, else what the lake's files say
// of themselves; then silver, history, quarantine and gold, by replaying
// every lake event.
func rebuild(ctx context.Context, cfg *config.Config, path string, days *warehouse.DayRange, st *BackfillStats, log *slog.Logger) error {
	t0 := time.Now()
	step := func(what string) {
		log.Debug("rebuild", "step", what, "elapsed", time.Since(t0).Round(time.Millisecond))
	}
	set, err := loadContracts(cfg, log)
	step("contracts loaded")
	if err != nil {
		return err
	}
	lk, err := lake.Open(cfg.Lake.Dir)
	if err != nil {
		return err
	}
	wcfg := cfg.Warehouse
	wcfg.Path = path
	nw, err := warehouse.Open(ctx, wcfg, lk, log)
	if err != nil {
		return err
	}
	if err := nw.SetContracts(ctx, set); err != nil {
		nw.Close()
		return err
	}
	step("new warehouse created")
	old, err := openOld(ctx, cfg, lk, log)
	if err != nil {
		nw.Close()
		return err
	}
	step("old warehouse opened")
	var ls warehouse.LakeState
	if old != nil {
		for id, t := range old.Schemas() {
			ls.Schemas = append(ls.Schemas, warehouse.Schema{Topic: old.Topic(id), Table: t})
		}
	} else if ls, err = nw.ReadLakeState(ctx); err != nil {
		nw.Close()
		return err
	}
	schemaTopic := kafka.SchemaTopic(cfg.Kafka.TopicPrefix)
	if err := nw.ApplyVersions(ctx, ls.Schemas, schemaTopic); err != nil {
		nw.Close()
		return err
	}
	if err := nw.Close(); err != nil {
		return err
	}
	step("tables created")
	if old != nil {
		err := old.CopyStateTo(ctx, path)
		if cerr := old.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("copy the warehouse's state: %w", err)
		}
	}
	step("state copied")
	if nw, err = warehouse.Open(ctx, wcfg, lk, log); err != nil {
		return err
	}
	defer nw.Close()
	step("reopened")
	if err := nw.SetContracts(ctx, set); err != nil {
		return err
	}
	if old == nil {
		if err := nw.SetFloor(ctx, ls.Floor, ls.Batch); err != nil {
			return err
		}
		if err := nw.ImportDeadLetters(ctx); err != nil {
			return err
		}
	}
	if st.Adopted, err = nw.AdoptLakeFiles(ctx); err != nil {
		return err
	}
	if old == nil {
		// Kafka trims what the lost warehouse had read: the next run
		// reads on from where the lake ends.
		if err := nw.RestoreOffsets(ctx); err != nil {
			return err
		}
	}
	step("lake files adopted")
	scope := warehouse.ReplayScope{ChunkEvents: replayChunk, Days: days}
	if days != nil {
		// A backfill of days starts from the lake's newest checkpoint
		// that fits; --all replays the lake from its start, as the proof
		// of what the lake holds.
		if scope.From, err = daysCheckpoint(ctx, cfg, nw, set, ls, old == nil, log); err != nil {
			return err
		}
		st.From = scope.From
		step("checkpoint loaded")
	}
	if st.ReplayStats, err = nw.Replay(ctx, scope); err != nil {
		return err
	}
	step("lake replayed")
	if days == nil {
		// (A backfill of days recomputes the live warehouse's marts.)
		if err := setMarts(ctx, cfg, nw); err != nil {
			return err
		}
		step("gold built")
	}
	err = nw.Close()
	step("closed")
	return err
}

// daysCheckpoint loads into nw the newest checkpoint that fits the
// backfill of days, and returns its position (0: none). A checkpoint
// records the lake's schema versions, which ls holds if it is the lake's
// (fromLake), not the old warehouse's newest: a lake whose files do not
// say their schemas (an older lakeflow wrote them) is replayed from its
// start, as before checkpoints.
func daysCheckpoint(ctx context.Context, cfg *config.Config, nw *warehouse.Warehouse, set contracts.Set, ls warehouse.LakeState, fromLake bool, log *slog.Logger) (change.LSN, error) {
	if !fromLake {
		var err error
		if ls, err = nw.ReadLakeState(ctx); err != nil {
			log.Warn("the lake's schemas cannot be read: the backfill replays the lake from its start, not from a checkpoint", "err", fault.OneLine(err.Error()))
			return 0, nil
		}
	}
	return startFromCheckpoint(ctx, cfg, nw, warehouse.InputsOf(set, ls.Schemas), math.MaxUint64, log)
}

// openOld opens the warehouse a rebuild replaces, or returns nil if it is
// missing or does not open (lost, corrupt): the lake alone is then the
// source. One that another process holds is an error.
func openOld(ctx context.Context, cfg *config.Config, lk *lake.Lake, log *slog.Logger) (*warehouse.Warehouse, error) {
	if _, err := os.Stat(cfg.Warehouse.Live); errors.Is(err, os.ErrNotExist) {
		log.Info("no warehouse to take the pipeline's state from: rebuilding from the lake alone", "warehouse", cfg.Warehouse.Live)
		return nil, nil
	}
	old, err := openLive(ctx, cfg, lk, log, 0, 0)
	if errors.Is(err, warehouse.ErrHeld) {
		return nil, err
	}
	if err != nil {
		log.Warn("the warehouse does not open: rebuilding from the lake alone", "warehouse", cfg.Warehouse.Live, "err", err)
		return nil, nil
	}
	return old, nil
}

// lakeDays says whether the lake holds files of a commit day from from to
// to, and its first and last days.
func lakeDays(cfg *config.Config, from, to time.Time) (first, last string, found bool, err error) {
	lk, err := lake.Open(cfg.Lake.Dir)
	if err != nil {
		return "", "", false, err
	}
	tables, err := lk.Tables()
	if err != nil {
		return "", "", false, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	lo, hi := from.Format(time.DateOnly), to.Format(time.DateOnly)
	for _, t := range tables {
		days, err := lk.Days(t)
		if err != nil {
			return "", "", false, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
		}
		for _, d := range days {
			if first == "" || d < first {
				first = d
			}
			last = max(last, d)
			found = found || (d >= lo && d <= hi)
		}
	}
	return first, last, found, nil
}

// backfillRange rebuilds what the days From to To changed: the keys those
// days changed are replayed from the lake with all their history (exact:
// a key's row depends on all of it), with the tables existence rules
// reference whole, into a shadow warehouse, and the slice is swapped into
// the warehouse in one transaction. With Mart, only that mart is
// recomputed, from silver.
func backfillRange(ctx context.Context, cfg *config.Config, opts BackfillOptions, log *slog.Logger) (BackfillStats, error) {
	var st BackfillStats
	t0 := time.Now()
	shadow := ""
	if opts.Mart == "" {
		first, last, found, err := lakeDays(cfg, opts.From, opts.To)
		if err != nil {
			return st, err
		}
		if !found {
			// Replaying the lake whole for nothing would take as long
			// as for something; a mistyped day is likelier.
			log.Warn("the lake holds no change committed on those days: nothing to backfill", "from", opts.From.Format(time.DateOnly),
				"to", opts.To.Format(time.DateOnly), "lake_first_day", first, "lake_last_day", last)
			st.Seconds, st.Path, st.Empty = time.Since(t0).Seconds(), cfg.Warehouse.Path, true
			return st, nil
		}
		shadow = cfg.Warehouse.Live + ".shadow"
		for _, p := range []string{shadow, shadow + ".wal"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return st, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
			}
		}
		defer os.Remove(shadow)
		if err := rebuild(ctx, cfg, shadow, &warehouse.DayRange{From: opts.From, To: opts.To}, &st, log); err != nil {
			return st, err
		}
	}
	set, err := loadContracts(cfg, log)
	if err != nil {
		return st, err
	}
	lk, err := lake.Open(cfg.Lake.Dir)
	if err != nil {
		return st, err
	}
	wh, err := openLive(ctx, cfg, lk, log, 0, 0)
	if err != nil {
		return st, err
	}
	defer wh.Close()
	if err := wh.SetContracts(ctx, set); err != nil {
		return st, err
	}
	if err := setMarts(ctx, cfg, wh); err != nil {
		return st, err
	}
	sl, err := wh.ReplaceSlice(ctx, shadow, opts.From, opts.To, opts.Mart)
	if err != nil {
		return st, err
	}
	st.Unpublished = !wh.Consistent()
	if err := publishWhole(ctx, wh, cfg.Warehouse.Path, log); err != nil {
		return st, err
	}
	log.Info("backfill of days done", "from", opts.From.Format(time.DateOnly), "to", opts.To.Format(time.DateOnly),
		"keys", sl.Keys, "marts", sl.Marts)
	st.Seconds, st.Path, st.Slice = time.Since(t0).Seconds(), cfg.Warehouse.Path, sl
	return st, wh.Close()
}
