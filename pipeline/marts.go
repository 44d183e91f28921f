package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/sql/gold"
	"github.com/lakeflow/lakeflow/warehouse"
)

// loadMarts reads the gold marts of gold.dir, or the demo's built into
// lakeflow when gold.dir was not set and does not exist, and checks that
// gold.refresh names only marts there are.
func loadMarts(cfg *config.Config) ([]gold.Mart, error) {
	var fsys fs.FS = os.DirFS(cfg.Gold.Dir)
	dir := cfg.Gold.Dir
	if _, err := os.Stat(cfg.Gold.Dir); errors.Is(err, os.ErrNotExist) {
		if cfg.Gold.DirSet {
			return nil, fmt.Errorf("%w: gold.dir %s does not exist", fault.ErrConfig, cfg.Gold.Dir)
		}
		fsys, dir = gold.Demo, "(built-in sql/gold)"
	}
	marts, err := gold.Load(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("%w: gold marts: %v", fault.ErrConfig, err)
	}
	var names, problems []string
	for _, m := range marts {
		names = append(names, m.Name)
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Gold.Refresh)) {
		if !slices.Contains(names, name) {
			problems = append(problems, fmt.Sprintf("gold.refresh.%s: there is no mart %s%s", name, name, fault.DidYouMean(name, names)))
		}
	}
	if len(problems) > 0 {
		have := "it has none"
		if len(names) > 0 {
			have = "its marts: " + strings.Join(names, ", ")
		}
		return nil, fmt.Errorf("%w: %s in %s (%s)", fault.ErrConfig, strings.Join(problems, "; "), dir, have)
	}
	return marts, nil
}

// setMarts gives the warehouse the gold marts of gold.dir.
func setMarts(ctx context.Context, cfg *config.Config, wh *warehouse.Warehouse) error {
	marts, err := loadMarts(cfg)
	if err != nil {
		return err
	}
	return giveMarts(ctx, cfg, wh, marts)
}

// giveMarts gives the warehouse marts loadMarts read.
func giveMarts(ctx context.Context, cfg *config.Config, wh *warehouse.Warehouse, marts []gold.Mart) error {
	captured := make([]string, len(cfg.Source.Tables))
	for i, t := range cfg.Source.Tables {
		captured[i] = t.Name
	}
	return wh.SetMarts(ctx, marts, cfg.Gold.Refresh, captured)
}
