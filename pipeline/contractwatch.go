package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// watchContracts looks at contracts.dir every second while lakeflow run
// --follow runs and hands edited contracts to each of out (the source,
// which releases a table parked for a change they now accept, and the
// consumer, whose rules follow them). Contracts that do not load are
// said once and not taken: the ones before stay.
func watchContracts(ctx context.Context, cfg *config.Config, log *slog.Logger, out ...chan<- contracts.Set) {
	seen := contractFiles(cfg.Contracts.Dir)
	eachSecond(ctx, func() bool {
		now := contractFiles(cfg.Contracts.Dir)
		if now == seen {
			return true
		}
		seen = now
		set, err := loadContracts(cfg, log)
		if err != nil {
			log.Error("the edited contracts are not taken: the ones before stay in force", "err", fault.OneLine(err.Error()))
			return true
		}
		for _, ch := range out {
			select {
			case ch <- set:
			case <-ctx.Done():
				return false
			}
		}
		return true
	})
}

// contractFiles is what a change of contracts.dir's files changes: their
// names, sizes and modification times.
func contractFiles(dir string) string {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.toml"))
	var b strings.Builder
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%s %d %d\n", p, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return b.String()
}
