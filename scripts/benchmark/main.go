// Command benchmark is scripts/bench: see that script for what it measures.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
)

// Result is what bench.json holds.
type Result struct {
	Changes         int64   `json:"changes"`
	Transactions    int64   `json:"transactions"`
	WALBytes        int64   `json:"wal_bytes"`
	LoadSeconds     float64 `json:"load_seconds"`
	RecvlogicalSecs float64 `json:"pg_recvlogical_seconds"`
	RecvlogicalRate float64 `json:"pg_recvlogical_changes_per_second"`
	// While pg_recvlogical drained the WAL: its own CPU, and how many
	// cores everything else kept busy, PostgreSQL's walsender decoding
	// the WAL above all. A pipe at the source's rate needs those cores
	// too, so the rest is what lakeflow may use.
	RecvlogicalCPU        float64 `json:"pg_recvlogical_cpu_seconds"`
	RecvlogicalOtherCores float64 `json:"pg_recvlogical_other_cores"`
	// Plain is lakeflow without contracts or gold marts; Rules with the
	// demo's contract rules and quarantine; Gold with those, the
	// customers' history and the demo's gold marts: on the same WAL, each
	// the fastest of three runs.
	Plain      RunResult `json:"lakeflow"`
	Rules      RunResult `json:"lakeflow_with_rules"`
	Gold       RunResult `json:"lakeflow_with_rules_and_gold"`
	RulesRatio float64   `json:"rules_rate_ratio"`
	GoldRatio  float64   `json:"gold_rate_ratio"`
	// LiveBudget is the CPU lakeflow may spend per event, in µs, to run
	// with rules, history and gold at 85% of pg_recvlogical's rate: the
	// machine's cores at that rate, less what the rest (the walsender)
	// took per change in that run.
	LiveBudget float64 `json:"live_target_cpu_us_per_event"`
	// Rates are every run's events per second, per variant.
	Rates [3][]float64 `json:"rates_plain_rules_gold"`
	// Backfill is lakeflow backfill --all of the Gold variant's lake.
	Backfill BackfillResult `json:"backfill_all"`
	// AsOf is lakeflow asof over the same lake: one table as of the end
	// and as of an early position (a tenth into the load's WAL), and the
	// whole warehouse as of the end (--out).
	AsOf map[string]AsOfResult `json:"asof"`
	// Check is lakeflow check (every part) beside the same lake and
	// source: its wall time, the faster of two, and its exit code (the
	// benchmark's data has no catalog: 6).
	CheckSeconds float64 `json:"check_seconds"`
	// Freshness is run --follow under a steady load: source commit to
	// silver commit, and to the published copy, per batch. The
	// benchmark's PostgreSQL commits asynchronously (synchronous_commit
	// off): WAL reaches logical decoding when the WAL writer flushes it,
	// in steps of up to wal_writer_delay (200 ms). FreshnessSync is the
	// same load committed as PostgreSQL's default commits (synchronous),
	// each transaction decoded and sent as it commits, measured next on
	// the same warehouse.
	Freshness     FreshnessResult `json:"freshness_steady"`
	FreshnessSync FreshnessResult `json:"freshness_steady_sync_commit"`
	// Idle is run --follow on the same warehouse with nothing to
	// capture, for -idle (10 minutes by default).
	Idle IdleResult `json:"idle"`
	// InitialLoad is the first run's copy of tables that already hold
	// rows, against COPY of the same tables (-initial-only).
	InitialLoad InitialLoadResult `json:"initial_load"`
	// Age is the aging run's costs at its start and end (-age).
	Age *AgeResult `json:"age,omitempty"`
	// Replay is lakeflow run into a fresh warehouse of the profiled run's
	// data directory: the source has nothing new; Kafka holds every
	// record, read from the start (the lake is not written again).
	Replay RunResult `json:"replay_from_kafka"`
	// StageCPU is the profiled run's CPU by pipe stage, in seconds, as
	// its profile sampled it (DuckDB's worker threads are "unlabelled":
	// see internal/stage); ProfiledCPU is that run's whole CPU time.
	StageCPU        map[string]float64 `json:"stage_cpu_seconds"`
	ProfiledCPU     float64            `json:"profiled_run_cpu_seconds"`
	CheckExit       int                `json:"check_exit_code"`
	CPUs            int                `json:"cpus"`
	GoVersion       string             `json:"go_version"`
	PostgresVersion string             `json:"postgres_version"`
	When            string             `json:"when"`
}

// BackfillResult measures lakeflow backfill --all (the faster of two).
type BackfillResult struct {
	Events  int64   `json:"events"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"events_per_second"`
	CPUSecs float64 `json:"cpu_seconds"`
}

// FreshnessResult measures run --follow under a steady load.
type FreshnessResult struct {
	Rate         int     `json:"changes_per_second"`
	Seconds      float64 `json:"seconds"`
	Batches      int     `json:"batches"`
	Changes      int     `json:"changes"`
	SilverP50    float64 `json:"silver_p50_seconds"`
	SilverP99    float64 `json:"silver_p99_seconds"`
	PublishedP50 float64 `json:"published_p50_seconds"`
	PublishedP99 float64 `json:"published_p99_seconds"`
	// CPUSeconds is lakeflow's CPU time over the whole --follow run
	// (3 s before the load, 7 s after it): what freshness costs.
	CPUSeconds float64 `json:"cpu_seconds"`
	// PeakRSS is that run's peak resident memory.
	PeakRSS int64 `json:"peak_rss_bytes"`
	// While the load ran: how busy the machine's cores were (a fraction
	// of all of them), and how many cores lakeflow and everything else
	// (PostgreSQL, the load, this bench) kept busy. A machine near 1 runs
	// every batch slower: its statements wait for a core.
	Cores         int     `json:"cores"`
	MachineBusy   float64 `json:"machine_busy_fraction"`
	LakeflowCores float64 `json:"lakeflow_cores"`
	OtherCores    float64 `json:"other_cores"`
}

// AsOfResult measures one lakeflow asof (the faster of two): wall time
// of the command, and the lake it read.
type AsOfResult struct {
	Position string  `json:"position"`
	Seconds  float64 `json:"seconds"`
	Files    int64   `json:"files"`
	Bytes    int64   `json:"bytes"`
	Events   int64   `json:"events"`
	// Checkpoint is the position of the state checkpoint it started from
	// (0: the lake's start); Events came after it.
	Checkpoint int64 `json:"checkpoint,omitempty"`
}

// RunResult measures one `lakeflow run`.
type RunResult struct {
	Events    int64   `json:"events"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"events_per_second"`
	PeakRSS   int64   `json:"peak_rss_bytes"`
	CPUSecs   float64 `json:"cpu_seconds"`
	LakeFiles int64   `json:"lake_files"`
	// Phases sums the warehouse's time per batch phase, in seconds.
	Phases      map[string]float64 `json:"warehouse_phase_seconds"`
	Quarantined int64              `json:"quarantined"`
	// OtherCores is how many cores everything but lakeflow kept busy
	// while it ran: PostgreSQL's walsender, in a run that reads the WAL.
	OtherCores float64 `json:"other_cores"`
}

func main() {
	events := flag.Int("events", 510663, "row changes to load (the seed's 510,663 by default)")
	out := flag.String("out", "bench.json", "where to write the JSON result (with -quick, only if given)")
	keep := flag.Bool("keep", false, "keep the working directory")
	publish := flag.String("publish-sizes", "", "instead: measure publishing warehouses of these sizes in GB (e.g. 0.1,1,5)")
	quick := flag.Bool("quick", false, "one run with rules, history and gold, its profile and the freshness; no other variant, backfill, asof or check")
	profile := flag.String("profile", "", "also keep the profiled run's CPU and heap profiles in this directory")
	bin := flag.String("bin", "", "measure this lakeflow binary instead of building the working tree's")
	freshness := flag.String("freshness", "", "instead: the freshness measurement alone, on a working directory an earlier run kept (-keep); it grows by the load each time")
	idleFor := flag.Duration("idle", 10*time.Minute, "how long to measure run --follow with nothing to capture (0: not at all; -quick: not unless given)")
	idleAlone := flag.Bool("idle-only", false, "instead: the idle measurement alone, on a warehouse of -events changes, written into -out's idle figures")
	initialRows := flag.Int("initial-only", 0, "instead: the initial load of this many rows (demo tables and a table of every type) against COPY, written into -out's initial-load figures")
	pubLoad := flag.Float64("publish-load", 0, "instead: run --follow under the steady load with copies every second, on the demo's warehouse and padded to this many GB")
	age := flag.Duration("age", 0, "instead: an aging run of run --follow this long (e.g. 30m) in compressed time, its costs at the start and the end, written into -out's age figures")
	ageRate := flag.Int("age-rate", steadyRate, "the aging run's steady load, changes a second")
	flag.Parse()
	if *pubLoad > 0 {
		if err := publishLoad(*pubLoad, *bin); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *age > 0 {
		if err := ageOnly(*age, *ageRate, *out, *bin); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *initialRows > 0 {
		if err := initialOnly(*initialRows, *out, *bin, *profile); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *idleAlone {
		if err := idleOnly(*events, *out, *bin, *idleFor); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *freshness != "" {
		if err := freshnessOnly(*freshness, *bin); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *publish != "" {
		if err := measurePublishing(*publish); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *quick {
		// A quick run never replaces bench.json unless asked to.
		given := false
		flag.Visit(func(f *flag.Flag) { given = given || f.Name == "out" })
		if !given {
			*out = ""
		}
		idled := false
		flag.Visit(func(f *flag.Flag) { idled = idled || f.Name == "idle" })
		if !idled {
			*idleFor = 0
		}
	}
	if err := run(*events, *out, *keep, *quick, *profile, *bin, *idleFor); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// startShop starts a private PostgreSQL under work with the demo's shop
// database, and returns it and the shop's DSN.
func startShop(ctx context.Context, work string) (*postgres.Cluster, string, error) {
	pgPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	step("starting a private PostgreSQL on port %d", pgPort)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cl, err := postgres.StartCluster(ctx, postgres.ClusterConfig{Dir: filepath.Join(work, "pg"), Port: pgPort, Ephemeral: true}, quiet)
	if err != nil {
		return nil, "", err
	}
	dsn := cl.DSN("shop")
	if err := cl.EnsureDatabase(ctx, "shop"); err == nil {
		err = demo.Setup(ctx, dsn)
	}
	if err != nil {
		cl.Stop()
		return nil, "", err
	}
	return cl, dsn, nil
}

// workbench is a working directory with the lakeflow binary to measure
// and a private PostgreSQL holding the demo's shop.
type workbench struct {
	work, bin, dsn string
	cl             *postgres.Cluster
}

// newWorkbench makes one under a new directory named after prefix, with
// bin (built from the working tree if "").
func newWorkbench(ctx context.Context, prefix, bin string) (*workbench, error) {
	work, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	os.Chmod(work, 0o755)
	w := &workbench{work: work}
	if w.bin, err = lakeflowBinary(bin, work); err == nil {
		w.cl, w.dsn, err = startShop(ctx, work)
	}
	if err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	return w, nil
}

// config writes lakeflow-0.toml in the working directory: the shop as
// its source (slot bench_0), data under data-0, Kafka on a free port, the
// demo's contracts and gold marts from the repository, and extra (TOML
// tables); it returns the file's path.
func (w *workbench) config(extra string) (string, error) {
	repo, err := os.Getwd()
	if err != nil {
		return "", err
	}
	kafkaPort, err := freePort()
	if err != nil {
		return "", err
	}
	cfgFile := filepath.Join(w.work, "lakeflow-0.toml")
	cfg := fmt.Sprintf("data_dir = \"data-0\"\n[source]\ndsn = %q\nslot = \"bench_0\"\n[kafka]\nlisten = \"127.0.0.1:%d\"\n[contracts]\ndir = %q\n[gold]\ndir = %q\n%s",
		w.dsn, kafkaPort, filepath.Join(repo, "contracts"), filepath.Join(repo, "sql", "gold"), extra)
	return cfgFile, os.WriteFile(cfgFile, []byte(cfg), 0o644)
}

// close stops its PostgreSQL and, unless keep, removes the directory.
func (w *workbench) close(keep bool) {
	w.cl.Stop()
	if !keep {
		os.RemoveAll(w.work)
	}
}

// readResult reads out, the result a measurement made alone (the -…-only
// modes) adds its figures to.
func readResult(out, mode string) (Result, error) {
	var res Result
	data, err := os.ReadFile(out)
	if err == nil {
		err = json.Unmarshal(data, &res)
	}
	if err != nil {
		return res, fmt.Errorf("read %s, which %s adds to: %v", out, mode, err)
	}
	return res, nil
}

// writeResult writes res to out.
func writeResult(out string, res Result) error {
	data, _ := json.MarshalIndent(res, "", "  ")
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// step says what the benchmark does now.
func step(format string, args ...any) { fmt.Fprintf(os.Stderr, "· "+format+"\n", args...) }

// measurePublishing prints what publishing costs by warehouse size.
func measurePublishing(sizes string) error {
	work, err := os.MkdirTemp("", "lakeflow-publish-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	costs, err := publishCosts(context.Background(), work, sizes)
	if err != nil {
		return err
	}
	fmt.Println("publishing warehouse.path (the live file checkpointed and copied, then synced and renamed into place):")
	for _, c := range costs {
		how := "copied"
		if c.Cloned {
			how = "cloned"
		}
		fmt.Printf("  %6.2f GB: %6.2f s  (%.0f MB/s, %s), batches held up %.2f s\n", float64(c.Bytes)/1e9, c.Seconds, float64(c.Bytes)/1e6/c.Seconds, how, c.Held)
	}
	return nil
}

func run(events int, out string, keep, quick bool, profileDir, bin string, idleFor time.Duration) error {
	ctx := context.Background()
	wb, err := newWorkbench(ctx, "lakeflow-bench-", bin)
	if err != nil {
		return err
	}
	defer wb.close(keep)
	work, bin, dsn, cl := wb.work, wb.bin, wb.dsn, wb.cl
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	// Nine pipelines on the same source, each with its own slot: three
	// of each variant (0 plain: no contracts, no gold; 1 rules: the demo's
	// contracts without history; 2 gold: the demo's contracts, history
	// included, and its gold marts). The machine is shared and noisy: the
	// runs interleave, and the fastest of each variant counts.
	// A tenth, of the gold variant, runs last with --profile: its
	// profile splits lakeflow's CPU by stage; its rate does not count.
	kinds := []int{0, 1, 2, 2, 1, 0, 0, 1, 2, 2}
	if quick {
		kinds = []int{2, 2}
	}
	profiled := len(kinds) - 1
	none := filepath.Join(work, "none")
	if err := os.MkdirAll(none, 0o755); err != nil {
		return err
	}
	rulesOnly, err := contractsWithoutHistory(filepath.Join(repo, "contracts"), filepath.Join(work, "rules-only"))
	if err != nil {
		return err
	}
	cfgFiles := make([]string, len(kinds))
	for i, kind := range kinds {
		contractsDir, goldDir := rulesOnly, none
		switch kind {
		case 0:
			contractsDir = none
		case 2:
			contractsDir, goldDir = filepath.Join(repo, "contracts"), filepath.Join(repo, "sql", "gold")
		}
		kafkaPort, err := freePort()
		if err != nil {
			return err
		}
		cfgFiles[i] = filepath.Join(work, fmt.Sprintf("lakeflow-%d.toml", i))
		cfg := fmt.Sprintf("data_dir = \"data-%d\"\n[source]\ndsn = %q\nslot = \"bench_%d\"\n[kafka]\nlisten = \"127.0.0.1:%d\"\n[contracts]\ndir = %q\n[gold]\ndir = %q\n",
			i, dsn, i, kafkaPort, contractsDir, goldDir)
		if err := os.WriteFile(cfgFiles[i], []byte(cfg), 0o644); err != nil {
			return err
		}
	}
	step("initial snapshots (create lakeflow's slots) and a slot for pg_recvlogical")
	for _, f := range cfgFiles {
		if _, _, err := runLakeflow(bin, f); err != nil {
			return err
		}
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('bench_recvlogical', 'pgoutput')"); err != nil {
		return err
	}
	var startLSN string
	conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&startLSN)

	step("loading %d changes in the demo's mix", events)
	t0 := time.Now()
	done, err := demo.Workload{Events: events, Seed: 42, ActionsPerTxn: 4}.Run(ctx, dsn)
	if err != nil {
		return err
	}
	res := Result{LoadSeconds: time.Since(t0).Seconds(), CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		When: time.Now().UTC().Format(time.RFC3339), Changes: int64(done.Changes), Transactions: int64(done.Transactions)}
	var endLSN string
	conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text, pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint, current_setting('server_version')", startLSN).
		Scan(&endLSN, &res.WALBytes, &res.PostgresVersion)

	step("pg_recvlogical draining the same changes (pgoutput, to /dev/null)")
	t0, m := time.Now(), sampleMachine()
	recv := exec.Command(cl.Bin("pg_recvlogical"), "-d", dsn, "--slot", "bench_recvlogical", "--start",
		"-o", "proto_version=1", "-o", "publication_names=lakeflow", "--endpos", endLSN, "-f", "/dev/null", "--no-loop")
	if out, err := recv.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_recvlogical: %v\n%s", err, out)
	}
	res.RecvlogicalSecs = time.Since(t0).Seconds()
	res.RecvlogicalRate = float64(res.Changes) / res.RecvlogicalSecs
	res.RecvlogicalCPU = (recv.ProcessState.UserTime() + recv.ProcessState.SystemTime()).Seconds()
	res.RecvlogicalOtherCores = max(m.busyCores()-res.RecvlogicalCPU/res.RecvlogicalSecs, 0)
	conn.Exec(ctx, "SELECT pg_drop_replication_slot('bench_recvlogical')")

	best := []*RunResult{&res.Plain, &res.Rules, &res.Gold}
	names := []string{"without contracts or gold", "with the demo's rules", "with rules, history and gold marts"}
	for i, kind := range kinds {
		if i == profiled {
			break
		}
		step("lakeflow run %s (%d of %d): WAL → Kafka → lake + silver", names[kind], i+1, profiled)
		var r RunResult
		if err := measure(bin, cfgFiles[i], &r); err != nil {
			return err
		}
		res.Rates[kind] = append(res.Rates[kind], math.Round(r.Rate))
		if b := best[kind]; b.Rate < r.Rate {
			*b = r
		}
	}
	step("lakeflow run %s with --profile", names[kinds[profiled]])
	if profileDir == "" {
		profileDir = filepath.Join(work, "profile")
	}
	var pr RunResult
	if err := measure(bin, cfgFiles[profiled], &pr, "--profile", profileDir); err != nil {
		return err
	}
	if res.StageCPU, err = stageCPU(filepath.Join(profileDir, "cpu.pprof")); err != nil {
		return err
	}
	res.ProfiledCPU = pr.CPUSecs
	step("lakeflow run replaying the profiled run's Kafka topics into a fresh warehouse")
	dataDir := filepath.Join(work, fmt.Sprintf("data-%d", profiled))
	for _, f := range []string{"live.duckdb", "live.duckdb.wal", "warehouse.duckdb", "warehouse.duckdb.wal"} {
		if err := os.Remove(filepath.Join(dataDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := measure(bin, cfgFiles[profiled], &res.Replay); err != nil {
		return err
	}
	if quick {
		if res.Freshness, res.FreshnessSync, err = freshness(ctx, bin, cfgFiles[0], filepath.Join(work, "data-0", "lake"), dsn); err != nil {
			return err
		}
		data, _ := json.MarshalIndent(res, "", "  ")
		fmt.Println(string(data))
		if keep {
			fmt.Fprintln(os.Stderr, "working directory kept:", work)
		}
		if out == "" {
			return nil
		}
		return os.WriteFile(out, append(data, '\n'), 0o644)
	}
	res.RulesRatio = res.Rules.Rate / res.Plain.Rate
	res.GoldRatio = res.Gold.Rate / res.Rules.Rate
	if g := res.Gold; g.Events > 0 {
		res.LiveBudget = 1e6 * (float64(sampleMachine().cores)/(0.85*res.RecvlogicalRate) - g.OtherCores*g.Seconds/float64(g.Events))
	}
	for i := range 2 {
		step("lakeflow backfill --all of the last run's lake (%d of 2)", i+1)
		b, err := backfill(bin, cfgFiles[len(cfgFiles)-1], filepath.Join(work, "rebuilt.duckdb"))
		if err != nil {
			return err
		}
		if b.Rate > res.Backfill.Rate {
			res.Backfill = b
		}
	}
	var early string
	if err := conn.QueryRow(ctx, "SELECT ($1::pg_lsn + $2::numeric / 10)::text", startLSN, res.WALBytes).Scan(&early); err != nil {
		return err
	}
	res.AsOf = map[string]AsOfResult{}
	for _, q := range []struct{ name, pos, what string }{
		{"table_end", endLSN, "--table orders"},
		{"table_early", early, "--table orders"},
		{"out_end", endLSN, "--out"},
	} {
		for i := range 2 {
			step("lakeflow asof %s %s (%d of 2)", q.pos, q.what, i+1)
			a, err := asof(bin, cfgFiles[len(cfgFiles)-1], q.pos, q.what, filepath.Join(work, fmt.Sprintf("asof-%d.duckdb", i)))
			if err != nil {
				return err
			}
			if b, ok := res.AsOf[q.name]; !ok || a.Seconds < b.Seconds {
				res.AsOf[q.name] = a
			}
		}
	}
	for i := range 2 {
		step("lakeflow check (%d of 2)", i+1)
		secs, code, err := check(bin, cfgFiles[len(cfgFiles)-1])
		if err != nil {
			return err
		}
		if res.CheckSeconds == 0 || secs < res.CheckSeconds {
			res.CheckSeconds, res.CheckExit = secs, code
		}
	}
	lakeDir := filepath.Join(work, fmt.Sprintf("data-%d", profiled-1), "lake")
	if res.Freshness, res.FreshnessSync, err = freshness(ctx, bin, cfgFiles[profiled-1], lakeDir, dsn); err != nil {
		return err
	}
	if idleFor > 0 {
		step("lakeflow run --follow with nothing to capture for %s", idleFor)
		if res.Idle, err = idle(ctx, bin, cfgFiles[profiled-1], lakeDir, dsn, fmt.Sprintf("bench_%d", profiled-1), idleFor); err != nil {
			return err
		}
	}
	line := func(name string, r RunResult) {
		fmt.Printf("  %-22s %.2f s  = %.0f events/s  (%.0f%% of pg_recvlogical; %d lake files, %d quarantined)\n"+
			"  %-22s peak RSS %.0f MiB, CPU %.1f s (%.1f µs per event; %.2f cores, the rest %.2f); stage %.2f s, decode %.2f s, lake %.2f s, rules %.2f s, history %.2f s, merge %.2f s, gold %.2f s, commit %.2f s\n",
			name, r.Seconds, r.Rate, 100*r.Rate/res.RecvlogicalRate, r.LakeFiles, r.Quarantined, "",
			float64(r.PeakRSS)/(1<<20), r.CPUSecs, 1e6*r.CPUSecs/float64(max(r.Events, 1)), r.CPUSecs/r.Seconds, r.OtherCores,
			r.Phases["stage"], r.Phases["decode"], r.Phases["lake"], r.Phases["rules"], r.Phases["history"], r.Phases["merge"], r.Phases["gold"], r.Phases["commit"])
	}
	fmt.Printf("lakeflow benchmark (%d CPUs, %s, PostgreSQL %s)\n  source load:           %d changes in %d transactions, %.1f MB of WAL (%.1f s)\n  pg_recvlogical:        %.2f s  = %.0f changes/s   (pgoutput decoding, the source's limit; %.2f cores, the rest, PostgreSQL's walsender above all, %.2f)\n",
		res.CPUs, res.GoVersion, res.PostgresVersion, res.Changes, res.Transactions, float64(res.WALBytes)/1e6, res.LoadSeconds,
		res.RecvlogicalSecs, res.RecvlogicalRate, res.RecvlogicalCPU/res.RecvlogicalSecs, res.RecvlogicalOtherCores)
	line("lakeflow run:", res.Plain)
	line("with contract rules:", res.Rules)
	line("+ history and gold:", res.Gold)
	fmt.Printf("  rules on / off:        %.0f%%\n  history and gold on / off: %.0f%% (with rules both; fastest of each; every run, events/s: plain %v, rules %v, gold %v)\n",
		100*res.RulesRatio, 100*res.GoldRatio, res.Rates[0], res.Rates[1], res.Rates[2])
	// What each target leaves lakeflow of the machine, per event.
	cores := float64(sampleMachine().cores)
	fmt.Printf("  CPU per event the targets allow on %.0f cores, and used: live at 85%% of pg_recvlogical (less the walsender's share) %.1f µs, %.1f used; replay at 4× %.1f µs, %.1f used; backfill at 6× %.1f µs, %.1f used\n",
		cores, res.LiveBudget, 1e6*res.Gold.CPUSecs/float64(max(res.Gold.Events, 1)),
		1e6*cores/(4*res.RecvlogicalRate), 1e6*res.Replay.CPUSecs/float64(max(res.Replay.Events, 1)),
		1e6*cores/(6*res.RecvlogicalRate), 1e6*res.Backfill.CPUSecs/float64(max(res.Backfill.Events, 1)))
	fmt.Printf("  replay from Kafka:     %.2f s  = %.0f events/s  (a fresh warehouse: silver + history + quarantine + gold; %.1f× pg_recvlogical)\n",
		res.Replay.Seconds, res.Replay.Rate, res.Replay.Rate/res.RecvlogicalRate)
	fmt.Printf("  backfill --all:        %.2f s  = %.0f events/s  (lake → silver + history + quarantine + gold; %.1f× pg_recvlogical)\n",
		res.Backfill.Seconds, res.Backfill.Rate, res.Backfill.Rate/res.RecvlogicalRate)
	for _, q := range []struct{ name, what string }{
		{"table_end", "--table orders, end"}, {"table_early", "--table orders, early"}, {"out_end", "--out, end"}} {
		a := res.AsOf[q.name]
		fmt.Printf("  asof %-22s %.2f s  (%d events from %d lake files, %.1f MB read)\n", q.what+":", a.Seconds, a.Events, a.Files, float64(a.Bytes)/1e6)
	}
	fmt.Printf("  check:                 %.2f s  (contracts vs the live source, catalog, population checks; exit %d)\n", res.CheckSeconds, res.CheckExit)
	for _, f := range []struct {
		how string
		FreshnessResult
	}{{"", res.Freshness}, {", synchronous commits", res.FreshnessSync}} {
		fmt.Printf("  freshness, --follow at %d changes/s%s: source commit → silver p50 %.2f s, p99 %.2f s; → published copy p50 %.2f s, p99 %.2f s (%d changes, %d batches, %.1f s CPU)\n",
			f.Rate, f.how, f.SilverP50, f.SilverP99, f.PublishedP50, f.PublishedP99, f.Changes, f.Batches, f.CPUSeconds)
		fmt.Printf("    during the load the machine's %d cores were %.0f%% busy: lakeflow %.2f cores, the rest (PostgreSQL, the load, the bench) %.2f\n",
			f.Cores, 100*f.MachineBusy, f.LakeflowCores, f.OtherCores)
	}
	if res.Idle.Seconds > 0 {
		printIdle(res.Idle)
	}
	data, _ := json.MarshalIndent(res, "", "  ")
	if keep {
		fmt.Fprintln(os.Stderr, "working directory kept:", work)
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// contractsWithoutHistory copies the contracts of dir to out with
// history = false.
func contractsWithoutHistory(dir, out string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.toml"))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		data = []byte(strings.ReplaceAll(string(data), "history = true", "history = false"))
		if err := os.WriteFile(filepath.Join(out, filepath.Base(f)), data, 0o644); err != nil {
			return "", err
		}
	}
	return out, nil
}

// backfill runs lakeflow backfill --all --out on a config and reads the
// rate it reports.
func backfill(bin, cfgFile, out string) (BackfillResult, error) {
	var r BackfillResult
	cmd := exec.Command(bin, "--config", cfgFile, "backfill", "--all", "--out", out)
	stdout, err := cmd.Output()
	if err != nil {
		return r, fmt.Errorf("lakeflow backfill: %v\n%s", err, stdout)
	}
	m := regexp.MustCompile(`: (\d+) events in ([0-9.]+) s`).FindSubmatch(stdout)
	if m == nil {
		return r, fmt.Errorf("lakeflow backfill said %q", stdout)
	}
	r.Events, _ = strconv.ParseInt(string(m[1]), 10, 64)
	r.Seconds, _ = strconv.ParseFloat(string(m[2]), 64)
	r.Rate = float64(r.Events) / r.Seconds
	r.CPUSecs = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	return r, nil
}

// check runs lakeflow check on a config and returns its wall time and
// exit code: findings (5 to 7) are an answer, other failures an error.
func check(bin, cfgFile string) (float64, int, error) {
	t0 := time.Now()
	cmd := exec.Command(bin, "--config", cfgFile, "check")
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); err != nil && (code < 5 || code > 7) {
		return 0, code, fmt.Errorf("lakeflow check: %v\n%s", err, out)
	}
	return time.Since(t0).Seconds(), cmd.ProcessState.ExitCode(), nil
}

// asof runs lakeflow asof on a config (what: --table T, or --out, to
// out) and reads what it read from its log.
func asof(bin, cfgFile, pos, what, out string) (AsOfResult, error) {
	r := AsOfResult{Position: pos}
	os.Remove(out)
	args := []string{"--config", cfgFile, "--log-level", "info", "asof", pos}
	if what == "--out" {
		args = append(args, "--out", out)
	} else {
		args = append(args, append(strings.Fields(what), "--format", "csv")...)
	}
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		return r, fmt.Errorf("lakeflow asof: %v\n%s", err, stderr.String())
	}
	r.Seconds = time.Since(t0).Seconds()
	m := regexp.MustCompile(`as-of warehouse built" checkpoint=(\d+) files=(\d+) bytes=(\d+) events=(\d+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		return r, fmt.Errorf("lakeflow asof said %q", stderr.String())
	}
	r.Checkpoint, _ = strconv.ParseInt(m[1], 10, 64)
	r.Files, _ = strconv.ParseInt(m[2], 10, 64)
	r.Bytes, _ = strconv.ParseInt(m[3], 10, 64)
	r.Events, _ = strconv.ParseInt(m[4], 10, 64)
	return r, nil
}

// The steady load of the freshness measurement.
const (
	steadyRate    = 5000
	steadySeconds = 20
)

// freshness measures the freshness under the steady load committed as
// the benchmark's PostgreSQL commits (asynchronously), then committed
// synchronously.
func freshness(ctx context.Context, bin, cfgFile, lakeDir, dsn string) (async, sync FreshnessResult, err error) {
	step("lakeflow run --follow under a steady %d changes/s for %d s", steadyRate, steadySeconds)
	load := steadyLoad{Rate: steadyRate, Seconds: steadySeconds, Seed: 43}
	if async, err = steady(ctx, bin, cfgFile, lakeDir, dsn, "steady.log", load); err != nil {
		return async, sync, err
	}
	step("again, the load committed synchronously")
	sync, err = steady(ctx, bin, cfgFile, lakeDir, dsn+"&synchronous_commit=on", "steady-sync.log", load)
	return async, sync, err
}

// steadyLoad is the demo workload at a steady rate for a while.
type steadyLoad struct {
	Rate, Seconds int
	Seed          uint64
}

// steady runs lakeflow run --follow while the demo workload makes
// load.Rate changes a second, stops it, and reads, for every change
// made meanwhile, the time from its source commit to the commit of the
// batch that applied it to silver (its lake file's _commit_ts, and
// lakeflow.batches), and to the first published copy that holds that
// batch (the run's log, kept as logName beside cfgFile, says when each
// copy was in place and which batch it holds).
func steady(ctx context.Context, bin, cfgFile, lakeDir, dsn, logName string, load steadyLoad) (FreshnessResult, error) {
	r := FreshnessResult{Rate: load.Rate}
	cmd := exec.Command(bin, "--config", cfgFile, "--log-level", "debug", "run", "--follow")
	var log strings.Builder
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		return r, err
	}
	time.Sleep(3 * time.Second) // streaming
	t0, m := time.Now(), sampleMachine()
	own0 := processTicks(cmd.Process.Pid)
	_, err := demo.Workload{Events: load.Rate * load.Seconds, Seed: load.Seed, Rate: load.Rate}.Run(ctx, dsn)
	r.Seconds = time.Since(t0).Seconds()
	busy := m.busyCores()
	own1 := processTicks(cmd.Process.Pid)
	if r.Cores = m.cores; busy > 0 && own1 >= own0 {
		r.MachineBusy = busy / float64(r.Cores)
		r.LakeflowCores = float64(own1-own0) / clockTicks / r.Seconds
		r.OtherCores = busy - r.LakeflowCores
	}
	time.Sleep(7 * time.Second) // the last batches, and a copy published after them
	cmd.Process.Signal(os.Interrupt)
	if werr := cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("lakeflow run --follow: %v\n%s", werr, log.String())
	}
	os.WriteFile(filepath.Join(filepath.Dir(cfgFile), logName), []byte(log.String()), 0o644)
	if err != nil {
		return r, err
	}
	r.CPUSeconds = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	r.PeakRSS = cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss * 1024
	// When each copy was in place, and the batch it holds.
	type copied struct {
		at    time.Time
		batch int64
	}
	var published []copied
	re := regexp.MustCompile(`time=(\S+) level=DEBUG msg="warehouse published" .* batch=(\d+)`)
	for _, m := range re.FindAllStringSubmatch(log.String(), -1) {
		at, err1 := time.Parse(time.RFC3339Nano, m[1])
		batch, err2 := strconv.ParseInt(m[2], 10, 64)
		if err1 == nil && err2 == nil {
			published = append(published, copied{at, batch})
		}
	}
	// Every table file of the lake (a list of those written meanwhile
	// outgrew the kernel's limit on one argument, 128 KiB, in minutes of
	// --follow), read for the changes committed since t0: their row
	// groups' statistics spare reading the rest.
	glob := literalGlob(lakeDir)
	out, err := exec.Command(bin, "--config", cfgFile, "sql", "--format", "csv", fmt.Sprintf(`SELECT epoch_us(e._commit_ts), epoch_us(b.committed_at), b.batch, count(*)
		FROM read_parquet(%s, union_by_name = true) e
		ASOF JOIN (SELECT lsn, committed_at, batch FROM lakeflow.batches WHERE consistent AND lsn IS NOT NULL) b ON e._cdc_seq <= b.lsn
		WHERE e._commit_ts >= make_timestamptz(%d) GROUP BY ALL`, glob, t0.UnixMicro())).CombinedOutput()
	if err != nil {
		return r, fmt.Errorf("lakeflow sql: %v: %s", err, out)
	}
	var silver, pub []float64
	batches := map[int64]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		var commit, applied, batch, n int64
		if _, err := fmt.Sscanf(line, "%d,%d,%d,%d", &commit, &applied, &batch, &n); err != nil {
			continue
		}
		batches[applied] = true
		for range n {
			silver = append(silver, float64(applied-commit)/1e6)
		}
		for _, p := range published {
			if p.batch >= batch {
				for range n {
					pub = append(pub, float64(p.at.UnixMicro()-commit)/1e6)
				}
				break
			}
		}
	}
	r.Batches, r.Changes = len(batches), len(silver)
	r.SilverP50, r.SilverP99 = quantile(silver, .5), quantile(silver, .99)
	r.PublishedP50, r.PublishedP99 = quantile(pub, .5), quantile(pub, .99)
	return r, nil
}

// clockTicks is the unit of the kernel's CPU times in /proc (USER_HZ).
const clockTicks = 100

// machineSample is the time all the machine's cores had spent busy, and
// in all, since boot, in clockTicks, and how many cores that is.
type machineSample struct {
	busy, total uint64
	cores       int
}

// busyCores says how many cores were busy on average since s was taken;
// 0 if it cannot tell.
func (s machineSample) busyCores() float64 {
	now := sampleMachine()
	if now.total <= s.total {
		return 0
	}
	return float64(now.busy-s.busy) / float64(now.total-s.total) * float64(s.cores)
}

// sampleMachine reads /proc/stat, which counts every core of the
// machine, not only those this process may use (runtime.NumCPU); zeros
// if it cannot.
func sampleMachine() (s machineSample) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	lines := strings.Split(string(data), "\n")
	for _, l := range lines[1:] {
		if len(l) > 3 && strings.HasPrefix(l, "cpu") && l[3] >= '0' && l[3] <= '9' {
			s.cores++
		}
	}
	line := lines[0]
	// cpu user nice system idle iowait irq softirq steal (guest time is in user)
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		switch {
		case i == 3 || i == 4:
			s.total += v
		case i < 8:
			s.busy += v
			s.total += v
		}
	}
	return s
}

// processTicks reads a process's CPU time, user and system, from
// /proc/PID/stat, in clockTicks; 0 if it cannot.
func processTicks(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name (in parentheses, which may
	// hold spaces): state is the first, utime the 12th, stime the 13th.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	return utime + stime
}

// lakeflowBinary returns bin, or, if it is empty, a build of the working
// tree in work.
func lakeflowBinary(bin, work string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	step("building lakeflow")
	bin = filepath.Join(work, "lakeflow")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

// freshnessOnly measures the freshness again on a working directory
// kept by -keep (its PostgreSQL, its first run's data directory),
// with bin or a build of the working tree.
func freshnessOnly(work, bin string) error {
	ctx := context.Background()
	cfgFile := filepath.Join(work, "lakeflow-0.toml")
	cfg, err := os.ReadFile(cfgFile)
	if err != nil {
		return err
	}
	m := regexp.MustCompile(`dsn = "(postgres://[^"]*:(\d+)/[^"]*)"`).FindStringSubmatch(string(cfg))
	if m == nil {
		return fmt.Errorf("%s names no PostgreSQL of the benchmark's", cfgFile)
	}
	port, _ := strconv.Atoi(m[2])
	if bin, err = lakeflowBinary(bin, work); err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cl, err := postgres.StartCluster(ctx, postgres.ClusterConfig{Dir: filepath.Join(work, "pg"), Port: port, Ephemeral: true}, quiet)
	if err != nil {
		return err
	}
	defer cl.Stop()
	async, sync, err := freshness(ctx, bin, cfgFile, filepath.Join(work, "data-0", "lake"), m[1])
	if err != nil {
		return err
	}
	data, _ := json.MarshalIndent(map[string]FreshnessResult{"freshness_steady": async, "freshness_steady_sync_commit": sync}, "", "  ")
	fmt.Println(string(data))
	return nil
}

// quantile is the q-quantile of xs (nearest rank), 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

// measure runs `lakeflow run` on a config and fills r.
func measure(bin, cfgFile string, r *RunResult, flags ...string) error {
	t0, m := time.Now(), sampleMachine()
	log, ru, err := runLakeflow(bin, cfgFile, flags...)
	if err != nil {
		return err
	}
	r.Seconds = time.Since(t0).Seconds()
	r.PeakRSS = ru.Maxrss * 1024
	r.CPUSecs = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	r.OtherCores = max(m.busyCores()-r.CPUSecs/r.Seconds, 0)
	r.Phases = phases(log)
	if m := regexp.MustCompile(`msg="run complete" events=(\d+) batches=\d+ lake_files=(\d+)`).FindStringSubmatch(log); m != nil {
		r.Events, _ = strconv.ParseInt(m[1], 10, 64)
		r.LakeFiles, _ = strconv.ParseInt(m[2], 10, 64)
	}
	for _, m := range regexp.MustCompile(` quarantined=(\d+)`).FindAllStringSubmatch(log, -1) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		r.Quarantined += n
	}
	r.Rate = float64(r.Events) / r.Seconds
	return nil
}

// runLakeflow runs `lakeflow run` to completion and returns its log and
// resource usage (peak RSS, CPU time).
func runLakeflow(bin, cfgFile string, flags ...string) (string, *syscall.Rusage, error) {
	cmd := exec.Command(bin, append([]string{"--config", cfgFile, "--log-level", "debug", "run"}, flags...)...)
	var log strings.Builder
	cmd.Stderr = &log
	if err := cmd.Run(); err != nil {
		return log.String(), nil, fmt.Errorf("lakeflow run: %v\n%s", err, log.String())
	}
	// Each configuration's runs are kept in its own log (lakeflow-N.log),
	// one after another: the live run's batches, then a replay's.
	if f, err := os.OpenFile(strings.TrimSuffix(cfgFile, ".toml")+".log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		f.WriteString(log.String())
		f.Close()
	}
	return log.String(), cmd.ProcessState.SysUsage().(*syscall.Rusage), nil
}

// phases adds up the per-phase durations of the "batch committed" lines.
func phases(log string) map[string]float64 {
	out := map[string]float64{}
	re := regexp.MustCompile(`(stage|decode|lake|rules|history|merge|gold|commit)=([0-9.]+[µm]?s)`)
	for _, line := range strings.Split(log, "\n") {
		// The batches, and the marts refreshed for each copy.
		if !strings.Contains(line, `msg="batch committed"`) && !strings.Contains(line, `msg="gold marts refreshed"`) {
			continue
		}
		for _, m := range re.FindAllStringSubmatch(line, -1) {
			if d, err := time.ParseDuration(m[2]); err == nil {
				out[m[1]] += d.Seconds()
			}
		}
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stageCPU reads a CPU profile's seconds by stage label (go tool pprof
// -tags); "unlabelled" is the rest (DuckDB's worker threads, start-up, the
// runtime, the garbage collector).
func stageCPU(path string) (map[string]float64, error) {
	out, err := exec.Command("go", "tool", "pprof", "-tags", path).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof -tags %s: %v", path, err)
	}
	seconds := func(v, unit string) float64 {
		d, _ := time.ParseDuration(v + unit)
		return d.Seconds()
	}
	res := map[string]float64{}
	total := regexp.MustCompile(`stage: Total ([0-9.]+)(\w+) of ([0-9.]+)(\w+)`).FindStringSubmatch(string(out))
	if total == nil {
		return nil, fmt.Errorf("go tool pprof -tags %s said %q", path, out)
	}
	res["unlabelled"] = seconds(total[3], total[4]) - seconds(total[1], total[2])
	for _, m := range regexp.MustCompile(`(?m)^\s+([0-9.]+)(\w+) \(\s*[0-9.]+%\): (\S+)$`).FindAllStringSubmatch(string(out), -1) {
		res[m[3]] = seconds(m[1], m[2])
	}
	return res, nil
}
