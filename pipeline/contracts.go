package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
)

// InitContracts writes a contract, from the live source, for each
// captured table that has none (only table, if it is not empty), and
// returns the files it wrote.
func InitContracts(ctx context.Context, cfg *config.Config, table string, log *slog.Logger) ([]string, error) {
	set, err := contracts.Load(cfg.Contracts.Dir)
	if err != nil {
		return nil, err
	}
	var todo []config.Table
	var kept []string
	for _, t := range cfg.Source.Tables {
		if table != "" && t.String() != table {
			continue
		}
		if set[t.String()] != nil {
			kept = append(kept, t.String())
			continue
		}
		todo = append(todo, t)
	}
	if len(kept) > 0 {
		log.Info("tables that already have a contract, left alone", "count", len(kept), "tables", strings.Join(kept, ", "))
	}
	if table != "" && len(todo) == 0 && set[table] == nil {
		return nil, fmt.Errorf("%w: --table %s is not in source.tables%s", fault.ErrConfig, table, fault.DidYouMean(table, tableNames(cfg.Source.Tables)))
	}
	if len(todo) == 0 {
		return nil, nil
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	env, err := startEnvironment(ctx, cfg, false, log)
	defer env.stop(log)
	if err != nil {
		return nil, err
	}
	drafts, gone, err := postgres.Describe(ctx, env.dsn, todo)
	if err != nil {
		return nil, err
	}
	for _, t := range gone {
		log.Warn("no contract written for a table the source does not have", "table", t.String())
	}
	if err := os.MkdirAll(cfg.Contracts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: create contracts.dir %s: %v", fault.ErrEnvironment, cfg.Contracts.Dir, err)
	}
	var written []string
	for _, d := range drafts {
		path := filepath.Join(cfg.Contracts.Dir, contracts.FileName(d.Table))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, os.ErrExist) {
			return written, fmt.Errorf("%w: %s exists but is not the contract of %s (its table key says otherwise); move it away", fault.ErrConfig, path, d.Table)
		}
		if err != nil {
			return written, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
		}
		_, err = f.Write(contracts.Render(d))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return written, fmt.Errorf("%w: write %s: %v", fault.ErrEnvironment, path, err)
		}
		written = append(written, path)
	}
	return written, nil
}
