package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// AgeResult is what a pipeline costs at the start and at the end of an
// aging run: lakeflow run --follow under a steady load, stopped and
// started again every ageEpoch, in compressed time — compaction and the
// bookkeeping's retention at intervals the run spans many times over
// (ageSettings), so that each of them has come round again and again by
// the end. A cost that grows with the pipeline's age and not with the
// work in hand shows as an end/start ratio above 1.
type AgeResult struct {
	Minutes      float64   `json:"minutes"`
	Epochs       int       `json:"epochs"`
	EpochSeconds float64   `json:"epoch_seconds"`
	Rate         int       `json:"changes_per_second"`
	Settings     string    `json:"compressed_settings"`
	Start        AgeSample `json:"start"`
	End          AgeSample `json:"end"`
}

// AgeSample is the costs after one epoch: its run --follow's, then the
// commands' a user runs beside it, with the run stopped.
type AgeSample struct {
	Minute         float64 `json:"minute"`
	LakeEvents     int64   `json:"lake_events"`
	LakeBytes      int64   `json:"lake_bytes"`
	WarehouseBytes int64   `json:"warehouse_bytes"`
	// Files per table-day (the largest), as run --follow's compaction
	// passes left them, then after lakeflow compact --before tomorrow.
	FilesPerTableDay          int     `json:"files_per_table_day"`
	FilesPerTableDayCompacted int     `json:"files_per_table_day_compacted"`
	CompactSeconds            float64 `json:"compact_seconds"`
	// Follow is the epoch's run --follow: freshness, CPU, peak RSS.
	Follow FreshnessResult `json:"follow"`
	// A batch's warehouse time (decode to commit) and a published
	// copy's, in that run, in seconds.
	BatchP50   float64 `json:"batch_p50_seconds"`
	BatchP99   float64 `json:"batch_p99_seconds"`
	PublishP50 float64 `json:"publish_p50_seconds"`
	PublishP99 float64 `json:"publish_p99_seconds"`
	// The commands: asof one table at the source's end, backfill of
	// today, check.
	AsOfTable       AsOfResult       `json:"asof_table"`
	BackfillDaySecs float64          `json:"backfill_day_seconds"`
	CheckSeconds    float64          `json:"check_seconds"`
	Bookkeeping     map[string]int64 `json:"bookkeeping_rows"`
}

// ageEpoch is how long each run --follow of an aging run lasts.
const ageEpoch = 3 * time.Minute

// ageSettings compress the pipeline's intervals to fit the aging run:
// a compaction pass and a state checkpoint every minute, replaced files
// kept a minute, batches in lakeflow.batches three minutes (pruned at
// each start), runs and checks a quarter of an hour.
const ageSettings = `[lake]
compact_interval = "1m"
compact_grace = "1m"
checkpoint_interval = "1m"
[bookkeeping]
batches = "3m"
runs = "15m"
checks = "15m"
`

// ageOnly runs the aging run for d at rate changes a second, prints the
// costs at its start and end, and writes them into out's age figures.
func ageOnly(d time.Duration, rate int, out, bin string) error {
	ctx := context.Background()
	res, err := readResult(out, "-age")
	if err != nil {
		return err
	}
	wb, err := newWorkbench(ctx, "lakeflow-bench-age-", bin)
	if err != nil {
		return err
	}
	defer wb.close(false)
	cfgFile, err := wb.config(ageSettings)
	if err != nil {
		return err
	}
	step("initial snapshot")
	if _, _, err := runLakeflow(wb.bin, cfgFile); err != nil {
		return err
	}
	// A short run (a try of the benchmark itself) has two shorter epochs.
	epoch := min(ageEpoch, d/2).Round(time.Second)
	epochs := int(d / epoch)
	r := &AgeResult{Epochs: epochs, EpochSeconds: epoch.Seconds(), Rate: rate, Settings: ageSettings}
	data := filepath.Join(wb.work, "data-0")
	t0 := time.Now()
	for e := range epochs {
		step("epoch %d of %d: lakeflow run --follow under %d changes/s for %s", e+1, epochs, rate, epoch)
		logName := fmt.Sprintf("age-%d.log", e)
		f, err := steady(ctx, wb.bin, cfgFile, filepath.Join(data, "lake"), wb.dsn, logName, steadyLoad{Rate: rate, Seconds: int(epoch.Seconds()), Seed: uint64(100 + e)})
		if err != nil {
			return err
		}
		if e != 0 && e != epochs-1 {
			continue
		}
		s := AgeSample{Minute: time.Since(t0).Minutes(), Follow: f}
		if err := s.measure(ctx, wb, cfgFile, data, logName); err != nil {
			return err
		}
		if e == 0 {
			r.Start = s
		} else {
			r.End = s
		}
	}
	r.Minutes = time.Since(t0).Minutes()
	res.Age = r
	printAge(r)
	return writeResult(out, res)
}

// measure fills in the sample's figures after an epoch whose run's log is
// logName beside cfgFile.
func (s *AgeSample) measure(ctx context.Context, wb *workbench, cfgFile, data, logName string) error {
	log, err := os.ReadFile(filepath.Join(filepath.Dir(cfgFile), logName))
	if err != nil {
		return err
	}
	s.BatchP50, s.BatchP99, s.PublishP50, s.PublishP99 = batchAndPublishTimes(string(log))
	lakeDir := filepath.Join(data, "lake")
	s.FilesPerTableDay = maxFilesPerTableDay(lakeDir)
	conn, err := pgx.Connect(ctx, wb.dsn)
	if err != nil {
		return err
	}
	var end string
	err = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end)
	conn.Close(ctx)
	if err != nil {
		return err
	}
	step("lakeflow asof %s --table orders", end)
	if s.AsOfTable, err = asof(wb.bin, cfgFile, end, "--table orders", filepath.Join(wb.work, "asof.duckdb")); err != nil {
		return err
	}
	today := time.Now().UTC().Format(time.DateOnly)
	step("lakeflow backfill --from %s --to %s", today, today)
	if s.BackfillDaySecs, err = timed(wb.bin, "--config", cfgFile, "backfill", "--from", today, "--to", today); err != nil {
		return err
	}
	step("lakeflow check")
	if s.CheckSeconds, _, err = check(wb.bin, cfgFile); err != nil {
		return err
	}
	// Compaction last: the replays above start from the state checkpoint
	// run --follow wrote (every minute here), not from the one lakeflow
	// compact writes at the lake's end.
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	step("lakeflow compact --before %s", tomorrow)
	if s.CompactSeconds, err = timed(wb.bin, "--config", cfgFile, "compact", "--before", tomorrow); err != nil {
		return err
	}
	s.FilesPerTableDayCompacted = maxFilesPerTableDay(lakeDir)
	s.LakeBytes, s.WarehouseBytes = treeBytes(lakeDir), treeBytes(filepath.Join(data, "warehouse.duckdb"))
	s.Bookkeeping = map[string]int64{}
	var q []string
	for _, t := range []string{"batches", "batch_hours", "lake_files", "runs", "checks", "compactions"} {
		q = append(q, fmt.Sprintf("SELECT '%s', count(*) FROM lakeflow.%s", t, t))
	}
	q = append(q, fmt.Sprintf("SELECT 'lake_events', count(*) FROM read_parquet(%s)", literalGlob(lakeDir)))
	out, err := exec.Command(wb.bin, "--config", cfgFile, "sql", "--format", "csv", strings.Join(q, " UNION ALL ")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("lakeflow sql: %v: %s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		name, n, ok := strings.Cut(line, ",")
		if v, err := strconv.ParseInt(n, 10, 64); ok && err == nil {
			s.Bookkeeping[name] = v
		}
	}
	s.LakeEvents = s.Bookkeeping["lake_events"]
	delete(s.Bookkeeping, "lake_events")
	return nil
}

// literalGlob is the SQL literal of the glob of a lake's table files.
func literalGlob(lakeDir string) string {
	return "'" + filepath.Join(lakeDir, "[!_]*", "date=*", "*.parquet") + "'"
}

// timed runs lakeflow with args and returns its wall time.
func timed(bin string, args ...string) (float64, error) {
	t0 := time.Now()
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("lakeflow %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return time.Since(t0).Seconds(), nil
}

// batchAndPublishTimes reads, from a run's debug log, the quantiles of a
// batch's warehouse time (decode to commit: staging overlaps the batch
// before) and of a published copy's duration.
func batchAndPublishTimes(log string) (batch50, batch99, pub50, pub99 float64) {
	var batches, copies []float64
	phase := regexp.MustCompile(` (decode|lake|rules|history|merge|gold|commit)=([0-9.]+[µm]?s)`)
	took := regexp.MustCompile(`msg="warehouse published" .*took=([0-9.]+[µm]?s)`)
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `msg="batch committed"`) {
			var sum float64
			for _, m := range phase.FindAllStringSubmatch(line, -1) {
				if d, err := time.ParseDuration(m[2]); err == nil {
					sum += d.Seconds()
				}
			}
			batches = append(batches, sum)
		} else if m := took.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				copies = append(copies, d.Seconds())
			}
		}
	}
	return quantile(batches, .5), quantile(batches, .99), quantile(copies, .5), quantile(copies, .99)
}

// maxFilesPerTableDay is the most Parquet files a table-day directory of
// the lake holds (lakeflow's own directories, _dlq and the like, aside).
func maxFilesPerTableDay(lakeDir string) int {
	days, _ := filepath.Glob(filepath.Join(lakeDir, "[^_]*", "date=*"))
	most := 0
	for _, d := range days {
		files, _ := filepath.Glob(filepath.Join(d, "*.parquet"))
		most = max(most, len(files))
	}
	return most
}

// treeBytes is the size of the files under path.
func treeBytes(path string) int64 {
	var n int64
	filepath.Walk(path, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// printAge prints the aging run's figures, start, end and their ratio.
func printAge(r *AgeResult) {
	fmt.Printf("aging run: %.0f min of run --follow under %d changes/s, restarted every %.0f s (%d epochs), compressed settings:\n  %s\n",
		r.Minutes, r.Rate, r.EpochSeconds, r.Epochs, strings.ReplaceAll(strings.TrimSpace(r.Settings), "\n", "; "))
	fmt.Printf("  %-44s %12s %12s %7s\n", "", "start", "end", "ratio")
	row := func(name string, a, b float64, unit string) {
		ratio := "-"
		if a > 0 {
			ratio = fmt.Sprintf("%.2f×", b/a)
		}
		fmt.Printf("  %-44s %10.2f%-2s %10.2f%-2s %7s\n", name, a, unit, b, unit, ratio)
	}
	s, e := r.Start, r.End
	row("minute of the run", s.Minute, e.Minute, "")
	row("lake events", float64(s.LakeEvents), float64(e.LakeEvents), "")
	row("lake", float64(s.LakeBytes)/1e6, float64(e.LakeBytes)/1e6, "MB")
	row("warehouse", float64(s.WarehouseBytes)/1e6, float64(e.WarehouseBytes)/1e6, "MB")
	row("files per table-day, as run --follow left", float64(s.FilesPerTableDay), float64(e.FilesPerTableDay), "")
	row("files per table-day, after lakeflow compact", float64(s.FilesPerTableDayCompacted), float64(e.FilesPerTableDayCompacted), "")
	row("lakeflow compact", s.CompactSeconds, e.CompactSeconds, "s")
	row("batch, warehouse time p50", s.BatchP50, e.BatchP50, "s")
	row("batch, warehouse time p99", s.BatchP99, e.BatchP99, "s")
	row("batches", float64(s.Follow.Batches), float64(e.Follow.Batches), "")
	row("publish p50", s.PublishP50, e.PublishP50, "s")
	row("publish p99", s.PublishP99, e.PublishP99, "s")
	row("commit to silver p99", s.Follow.SilverP99, e.Follow.SilverP99, "s")
	row("commit to published copy p99", s.Follow.PublishedP99, e.Follow.PublishedP99, "s")
	row("run --follow CPU", s.Follow.CPUSeconds, e.Follow.CPUSeconds, "s")
	row("run --follow peak RSS", float64(s.Follow.PeakRSS)/(1<<20), float64(e.Follow.PeakRSS)/(1<<20), "Mi")
	row("asof --table orders", s.AsOfTable.Seconds, e.AsOfTable.Seconds, "s")
	row("backfill --from/--to today", s.BackfillDaySecs, e.BackfillDaySecs, "s")
	row("check", s.CheckSeconds, e.CheckSeconds, "s")
	for _, t := range []string{"batches", "batch_hours", "lake_files", "runs", "checks", "compactions"} {
		row("lakeflow."+t+" rows", float64(s.Bookkeeping[t]), float64(e.Bookkeeping[t]), "")
	}
}
