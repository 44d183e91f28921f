package demo

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/lakeflow/lakeflow/catalog"
	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// WriteProject writes the demo's contracts and catalog entries, as this
// repository holds them, to the directories the configuration names,
// when neither exists (the catalog describes what the contracts say, so
// one is not written beside a project's own other): the demo run from a
// directory of its own then has its rules, quarantine and history, and
// the lakeflow check it suggests finds the catalog.
func WriteProject(cfg *config.Config, log *slog.Logger) error {
	dirs := []struct {
		files     fs.FS
		dir, what string
	}{{contracts.Demo, cfg.Contracts.Dir, "contracts"}, {catalog.Demo, cfg.Catalog.Dir, "catalog"}}
	for _, d := range dirs {
		if _, err := os.Stat(d.dir); !errors.Is(err, os.ErrNotExist) {
			if err != nil {
				return fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
			}
			return nil
		}
	}
	for _, d := range dirs {
		// Under another name first: a copy cut short is not taken for
		// the project's own next time.
		tmp := d.dir + ".writing"
		err := os.RemoveAll(tmp)
		if err == nil {
			err = os.CopyFS(tmp, d.files)
		}
		if err == nil {
			err = os.Rename(tmp, d.dir)
		}
		if err != nil {
			return fmt.Errorf("%w: write the demo's %s to %s: %v", fault.ErrEnvironment, d.what, d.dir, err)
		}
		log.Info("wrote the demo's "+d.what, "dir", d.dir)
	}
	return nil
}
