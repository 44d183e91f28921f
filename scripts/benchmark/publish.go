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

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/lake"
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

// publishLoad measures run --follow under the steady load with a copy
// published every second (warehouse.publish_interval = "1s"), on the
// demo's warehouse and then on the same warehouse padded to about gb GB
// (a table of incompressible rows in a schema of its own, which every
// copy carries): what a grown warehouse costs readers (commit to
// published copy) and the pipeline (commit to silver, CPU). Run with
// TMPDIR on the file system to measure (XFS, btrfs: copies are clones).
func publishLoad(gb float64, bin string) error {
	ctx := context.Background()
	wb, err := newWorkbench(ctx, "lakeflow-publish-load-", bin)
	if err != nil {
		return err
	}
	defer wb.close(false)
	cfgFile, err := wb.config("[warehouse]\npublish_interval = \"1s\"\n")
	if err != nil {
		return err
	}
	step("initial snapshot")
	if _, _, err := runLakeflow(wb.bin, cfgFile); err != nil {
		return err
	}
	data := filepath.Join(wb.work, "data-0")
	live := filepath.Join(data, "live.duckdb")
	underLoad := func(name string, seed uint64) error {
		step("lakeflow run --follow under a steady %d changes/s for %d s, copies every second, %s", steadyRate, steadySeconds, name)
		f, err := steady(ctx, wb.bin, cfgFile, filepath.Join(data, "lake"), wb.dsn, name+".log", steadyLoad{Rate: steadyRate, Seconds: steadySeconds, Seed: seed})
		if err != nil {
			return err
		}
		log, err := os.ReadFile(filepath.Join(wb.work, name+".log"))
		if err != nil {
			return err
		}
		_, _, p50, p99 := batchAndPublishTimes(string(log))
		fi, err := os.Stat(live)
		if err != nil {
			return err
		}
		fmt.Printf("  %-8s %6.2f GB: copies %3d, each p50 %.2f s p99 %.2f s (%s); commit to copy p50 %.2f s p99 %.2f s; to silver p50 %.2f s p99 %.2f s; %d batches; lakeflow %.2f cores, %.1f s CPU\n",
			name, float64(fi.Size())/1e9, strings.Count(string(log), `msg="warehouse published"`), p50, p99, copiedOrCloned(string(log)),
			f.PublishedP50, f.PublishedP99, f.SilverP50, f.SilverP99, f.Batches, f.LakeflowCores, f.CPUSeconds)
		return nil
	}
	fmt.Printf("publishing under a steady load (%s):\n", filepath.Dir(wb.work))
	if err := underLoad("demo", 43); err != nil {
		return err
	}
	step("padding the warehouse to %g GB", gb)
	db, err := sql.Open("duckdb", live)
	if err != nil {
		return err
	}
	// About 35 bytes a row on disk, as publishCosts' rows.
	_, err = db.Exec(fmt.Sprintf(`CREATE SCHEMA ballast; CREATE TABLE ballast.rows AS
		SELECT i AS id, md5(i::VARCHAR) AS a, md5((i * 7)::VARCHAR) AS b FROM range(%d) t(i)`, int64(gb*1e9/35)))
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return underLoad("padded", 44)
}

// copiedOrCloned says how a run's log says its copies were made.
func copiedOrCloned(log string) string {
	if strings.Contains(log, "cloned=true") {
		return "cloned"
	}
	return "copied"
}
