package demo

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/lakeflow/lakeflow/catalog"
	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/pipeline/config"
	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// WriteProject writes the demo's contracts and catalog entries, as this
// repository holds them, to the directories the configuration names,
// each only where no such directory exists: the demo run from a
// directory of its own then has its rules, quarantine and history, and
// the lakeflow check it suggests finds the catalog.
func WriteProject(cfg *config.Config, log *slog.Logger) error {
	for _, d := range []struct {
		files     fs.FS
		dir, what string
	}{{contracts.Demo, cfg.Contracts.Dir, "contracts"}, {catalog.Demo, cfg.Catalog.Dir, "catalog"}} {
		if _, err := os.Stat(d.dir); !errors.Is(err, os.ErrNotExist) {
			if err != nil {
				return fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
			}
			continue
		}
		if err := os.CopyFS(d.dir, d.files); err != nil {
			return fmt.Errorf("%w: write the demo's %s to %s: %v", fault.ErrEnvironment, d.what, d.dir, err)
		}
		log.Info("wrote the demo's "+d.what, "dir", d.dir)
	}
	return nil
}
