package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/warehouse"
)

// CompactOptions say what lakeflow compact merges: Table ("": every
// captured table) and the commit days before Before (YYYY-MM-DD).
type CompactOptions struct {
	Table  string
	Before string
}

// CompactResult is what lakeflow compact did.
type CompactResult struct {
	warehouse.CompactStats
	Checkpoint CheckpointStats
	// CheckpointErr says why no checkpoint was written, if one was not:
	// the compaction stands, and checkpoints only save replays time.
	CheckpointErr error
}

// Compact merges the lake's small files (warehouse.Compact), publishes
// the warehouse, whose lakeflow.lake_files then lists the merged files,
// and writes a state checkpoint of the lake (BuildCheckpoint) unless
// lake.checkpoint_interval is off.
func Compact(ctx context.Context, cfg *config.Config, opts CompactOptions, log *slog.Logger) (CompactResult, error) {
	var st CompactResult
	if opts.Table != "" {
		t, err := config.ParseTable(opts.Table)
		if err != nil {
			return st, fmt.Errorf("%w: --table: %v", fault.ErrConfig, err)
		}
		opts.Table = t.String()
	}
	if _, err := time.Parse(time.DateOnly, opts.Before); err != nil {
		return st, fmt.Errorf("%w: --before %q: want a day like 2026-12-07", fault.ErrConfig, opts.Before)
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return st, fmt.Errorf("%w (lakeflow compact does not run beside lakeflow run: stop it first)", err)
	}
	defer unlock()
	if st.CompactStats, err = compactLive(ctx, cfg, opts, log); err != nil {
		return st, err
	}
	if cfg.Lake.CheckpointInterval > 0 {
		st.Checkpoint, st.CheckpointErr = BuildCheckpoint(ctx, cfg, log)
	}
	return st, ctx.Err()
}

// compactLive merges the lake's small files and publishes the live
// warehouse, holding the data directory.
func compactLive(ctx context.Context, cfg *config.Config, opts CompactOptions, log *slog.Logger) (warehouse.CompactStats, error) {
	var st warehouse.CompactStats
	lk, err := lake.Open(cfg.Lake.Dir)
	if err != nil {
		return st, err
	}
	if err := ensureLive(cfg, log); err != nil {
		return st, err
	}
	wh, err := openLive(ctx, cfg, lk, log, 0, 0)
	if err != nil {
		return st, err
	}
	defer wh.Close()
	if opts.Table != "" {
		if _, ok := wh.Schemas()[opts.Table]; !ok {
			names := slices.Sorted(maps.Keys(wh.Schemas()))
			return st, fmt.Errorf("%w: --table %s: the warehouse holds no such table%s (it holds %s)", fault.ErrConfig, opts.Table, fault.DidYouMean(opts.Table, names), strings.Join(names, ", "))
		}
	}
	// The copy's marts as of its silver: partitions a run left waiting
	// for its next copy (it stopped first) are refreshed in it. Given
	// first: a mart file to correct is said before anything is merged.
	if err := setMarts(ctx, cfg, wh); err != nil {
		return st, err
	}
	if st, err = wh.Compact(ctx, warehouse.CompactOptions{Table: opts.Table, Before: opts.Before, Target: cfg.Lake.CompactTarget, Grace: cfg.Lake.CompactGrace, Wait: true}); err != nil {
		return st, err
	}
	return st, publishWhole(ctx, wh, cfg.Warehouse.Path, log)
}
