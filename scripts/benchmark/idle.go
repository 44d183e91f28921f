package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// IdleResult measures run --follow while the source's captured tables
// are idle: what it costs, and that the slot still advances.
type IdleResult struct {
	Seconds float64 `json:"seconds"`
	// CPUSeconds is lakeflow's CPU time over the idle stretch; WrittenBytes
	// what it wrote to storage meanwhile (/proc/PID/io write_bytes: the
	// warehouse, the lake, Kafka's log and published copies together).
	CPUSeconds   float64 `json:"cpu_seconds"`
	WrittenBytes int64   `json:"written_bytes"`
	// What the stretch added: rows of lakeflow.batches, published copies,
	// lake files.
	Batches   int64 `json:"batches"`
	Published int   `json:"published_copies"`
	LakeFiles int   `json:"lake_files"`
	// SlotAdvancedBytes is how far the slot's confirmed position moved
	// (heartbeats): the source's WAL is not held while idle.
	SlotAdvancedBytes int64 `json:"slot_advanced_bytes"`
}

// idle runs lakeflow run --follow with nothing to capture for d, after
// it has caught up, and measures what that costs.
func idle(ctx context.Context, bin, cfgFile, lakeDir, dsn, slot string, d time.Duration) (IdleResult, error) {
	r := IdleResult{}
	cmd := exec.Command(bin, "--config", cfgFile, "--log-level", "debug", "run", "--follow")
	var log strings.Builder
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		return r, err
	}
	time.Sleep(20 * time.Second) // streaming, caught up, a copy published
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		cmd.Process.Kill()
		return r, err
	}
	defer conn.Close(ctx)
	confirmed := func() (n int64) {
		conn.QueryRow(ctx, "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&n)
		return n
	}
	before, lake0, pid := len(log.String()), lakeFiles(lakeDir), cmd.Process.Pid
	slot0, ticks0, io0 := confirmed(), processTicks(pid), writtenBytes(pid)
	t0 := time.Now()
	time.Sleep(d)
	r.Seconds = time.Since(t0).Seconds()
	r.CPUSeconds = float64(processTicks(pid)-ticks0) / clockTicks
	r.WrittenBytes = writtenBytes(pid) - io0
	r.SlotAdvancedBytes = confirmed() - slot0
	r.LakeFiles = lakeFiles(lakeDir) - lake0
	during := log.String()[before:]
	r.Published = strings.Count(during, `msg="warehouse published"`)
	r.Batches = int64(strings.Count(during, `msg="batch committed"`))
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		return r, fmt.Errorf("lakeflow run --follow: %v\n%s", err, log.String())
	}
	os.WriteFile(filepath.Join(filepath.Dir(cfgFile), "idle.log"), []byte(log.String()), 0o644)
	return r, nil
}

// writtenBytes reads what a process has written to storage from
// /proc/PID/io; 0 if it cannot.
func writtenBytes(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// lakeFiles counts the lake's Parquet files.
func lakeFiles(lakeDir string) int {
	files, _ := filepath.Glob(filepath.Join(lakeDir, "*", "*", "*.parquet"))
	return len(files)
}

// idleOnly measures the idle costs alone, on a warehouse of events
// changes of the demo's mix (the gold variant: contracts, history, gold
// marts), and writes them into out's idle figures, keeping the rest of
// out: a full run measures them at its end, after everything else.
func idleOnly(events int, out, bin string, d time.Duration) error {
	ctx := context.Background()
	res, err := readResult(out, "-idle-only")
	if err != nil {
		return err
	}
	wb, err := newWorkbench(ctx, "lakeflow-bench-idle-", bin)
	if err != nil {
		return err
	}
	defer wb.close(false)
	work, bin, dsn := wb.work, wb.bin, wb.dsn
	cfgFile, err := wb.config("")
	if err != nil {
		return err
	}
	step("initial snapshot, then %d changes in the demo's mix, applied", events)
	if _, _, err := runLakeflow(bin, cfgFile); err != nil {
		return err
	}
	if _, err := (demo.Workload{Events: events, Seed: 42, ActionsPerTxn: 4}).Run(ctx, dsn); err != nil {
		return err
	}
	if _, _, err := runLakeflow(bin, cfgFile); err != nil {
		return err
	}
	step("lakeflow run --follow with nothing to capture for %s", d)
	if res.Idle, err = idle(ctx, bin, cfgFile, filepath.Join(work, "data-0", "lake"), dsn, "bench_0", d); err != nil {
		return err
	}
	printIdle(res.Idle)
	return writeResult(out, res)
}

// printIdle prints the idle figures.
func printIdle(i IdleResult) {
	fmt.Printf("  idle, --follow for %.0f s with nothing to capture: %.2f s CPU, %.1f MB written, %d batches, %d copies, %d lake files; the slot advanced %d bytes\n",
		i.Seconds, i.CPUSeconds, float64(i.WrittenBytes)/1e6, i.Batches, i.Published, i.LakeFiles, i.SlotAdvancedBytes)
}
