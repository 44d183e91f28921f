package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/lakeflow/lakeflow/catalog"
	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/report"
	"github.com/lakeflow/lakeflow/warehouse"
)

// Report writes lakeflow report's page to out: the published warehouse
// read as any reader does, the lineage of what exists (the catalog
// derived from the lake; the documented one if that cannot be), the
// contracts' SLAs.
func Report(ctx context.Context, cfg *config.Config, out string, since time.Duration, log *slog.Logger) error {
	r, err := warehouse.OpenReader(ctx, cfg.Warehouse.Path)
	if err != nil {
		return err
	}
	defer r.Close()
	cat, err := DeriveCatalog(ctx, cfg, log)
	if err != nil {
		log.Warn("the lineage is the documented catalog's: the lake's cannot be derived", "err", fault.OneLine(err.Error()))
		if cat, err = catalog.Load(cfg.Catalog.Dir); err != nil {
			return err
		}
	}
	set, err := contracts.Load(cfg.Contracts.Dir)
	if err != nil {
		return err
	}
	page, err := report.Build(ctx, report.Inputs{Reader: r, Catalog: cat, Contracts: set, Since: since, Now: time.Now()})
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+".writing")
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	err = report.Render(f, page)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, out)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%w: write %s: %v", fault.ErrEnvironment, out, err)
	}
	return nil
}
