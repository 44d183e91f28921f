package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lakeflow/lakeflow/pipeline/config"
	"github.com/lakeflow/lakeflow/pipeline/lake"
	"github.com/lakeflow/lakeflow/warehouse"
)

// PublishCost is what publishing a warehouse of one size takes.
type PublishCost struct {
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	// Held is the part that holds batches up: the checkpoint and the
	// file's copy.
	Held float64 `json:"held_seconds"`
	// Cloned: the file system cloned the file (reflinks: XFS, btrfs)
	// instead of copying its bytes.
	Cloned bool `json:"cloned"`
}

// publishCosts measures lakeflow's publishing (a transaction-consistent
// copy of the live warehouse, renamed into place) for warehouses of
// about each size (GB): a silver table of incompressible rows is made to
// that size, then published the way run --follow does it.
func publishCosts(ctx context.Context, work, sizes string) ([]PublishCost, error) {
	var out []PublishCost
	for _, f := range strings.Split(sizes, ",") {
		gb, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || gb <= 0 {
			return nil, fmt.Errorf("-publish-sizes: %q is not a size in GB", f)
		}
		dir := filepath.Join(work, fmt.Sprintf("publish-%g", gb))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		live := filepath.Join(dir, "live.duckdb")
		step("publishing a %g GB warehouse: making it", gb)
		db, err := sql.Open("duckdb", live)
		if err != nil {
			return nil, err
		}
		// About 35 bytes a row on disk: two MD5s hardly compress.
		rows := int64(gb * 1e9 / 35)
		_, err = db.Exec(fmt.Sprintf(`CREATE SCHEMA silver; CREATE TABLE silver.big AS
			SELECT i AS id, md5(i::VARCHAR) AS a, md5((i * 7)::VARCHAR) AS b, now() AS _commit_ts FROM range(%d) t(i)`, rows))
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		lk, err := lake.Open(filepath.Join(dir, "lake"))
		if err != nil {
			return nil, err
		}
		wh, err := warehouse.Open(ctx, config.Warehouse{Path: live, MemoryLimit: 1 << 30}, lk, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return nil, err
		}
		step("publishing a %g GB warehouse", gb)
		c, err := wh.Publish(ctx, filepath.Join(dir, "warehouse.duckdb"))
		wh.Close()
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(live)
		if err != nil {
			return nil, err
		}
		out = append(out, PublishCost{Bytes: fi.Size(), Seconds: c.Took.Seconds(), Held: c.Held.Seconds(), Cloned: c.Cloned})
		os.RemoveAll(dir)
	}
	return out, nil
}
