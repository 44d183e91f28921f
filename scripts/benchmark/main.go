// Command benchmark is scripts/bench: see that script for what it measures.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
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
	LakeflowEvents  int64   `json:"lakeflow_events"`
	LakeflowSeconds float64 `json:"lakeflow_seconds"`
	LakeflowRate    float64 `json:"lakeflow_events_per_second"`
	LakeflowPeakRSS int64   `json:"lakeflow_peak_rss_bytes"`
	LakeflowCPUSecs float64 `json:"lakeflow_cpu_seconds"`
	LakeFiles       int64   `json:"lake_files"`
	// Phases sums the warehouse's time per batch phase, in seconds.
	Phases          map[string]float64 `json:"warehouse_phase_seconds"`
	CPUs            int                `json:"cpus"`
	GoVersion       string             `json:"go_version"`
	PostgresVersion string             `json:"postgres_version"`
	When            string             `json:"when"`
}

func main() {
	events := flag.Int("events", 510663, "row changes to load (the seed's 510,663 by default)")
	out := flag.String("out", "bench.json", "where to write the JSON result")
	keep := flag.Bool("keep", false, "keep the working directory")
	flag.Parse()
	if err := run(*events, *out, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(events int, out string, keep bool) error {
	ctx := context.Background()
	work, err := os.MkdirTemp("", "lakeflow-bench-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(work)
	}
	os.Chmod(work, 0o755)
	step := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "· "+format+"\n", args...) }

	step("building lakeflow")
	bin := filepath.Join(work, "lakeflow")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	pgPort, err := freePort()
	if err != nil {
		return err
	}
	step("starting a private PostgreSQL on port %d", pgPort)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cl, err := postgres.StartCluster(ctx, postgres.ClusterConfig{Dir: filepath.Join(work, "pg"), Port: pgPort, Ephemeral: true}, quiet)
	if err != nil {
		return err
	}
	defer cl.Stop()
	if err := cl.EnsureDatabase(ctx, "shop"); err != nil {
		return err
	}
	dsn := cl.DSN("shop")
	if err := demo.Setup(ctx, dsn); err != nil {
		return err
	}
	kafkaPort, err := freePort()
	if err != nil {
		return err
	}
	cfgFile := filepath.Join(work, "lakeflow.toml")
	cfg := fmt.Sprintf("data_dir = \"data\"\n[source]\ndsn = %q\n[kafka]\nlisten = \"127.0.0.1:%d\"\n", dsn, kafkaPort)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return err
	}
	step("initial snapshot (creates lakeflow's slot) and a second slot for pg_recvlogical")
	if _, _, err := runLakeflow(bin, cfgFile); err != nil {
		return err
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
	t0 = time.Now()
	recv := exec.Command(cl.Bin("pg_recvlogical"), "-d", dsn, "--slot", "bench_recvlogical", "--start",
		"-o", "proto_version=1", "-o", "publication_names=lakeflow", "--endpos", endLSN, "-f", "/dev/null", "--no-loop")
	if out, err := recv.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_recvlogical: %v\n%s", err, out)
	}
	res.RecvlogicalSecs = time.Since(t0).Seconds()
	res.RecvlogicalRate = float64(res.Changes) / res.RecvlogicalSecs
	conn.Exec(ctx, "SELECT pg_drop_replication_slot('bench_recvlogical')")

	step("lakeflow run: WAL → Kafka → lake + silver")
	t0 = time.Now()
	log, ru, err := runLakeflow(bin, cfgFile)
	if err != nil {
		return err
	}
	res.LakeflowSeconds = time.Since(t0).Seconds()
	res.LakeflowPeakRSS = ru.Maxrss * 1024
	res.LakeflowCPUSecs = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	res.Phases = phases(log)
	if m := regexp.MustCompile(`msg="run complete" events=(\d+) batches=\d+ lake_files=(\d+)`).FindStringSubmatch(log); m != nil {
		res.LakeflowEvents, _ = strconv.ParseInt(m[1], 10, 64)
		res.LakeFiles, _ = strconv.ParseInt(m[2], 10, 64)
	}
	res.LakeflowRate = float64(res.LakeflowEvents) / res.LakeflowSeconds

	fmt.Printf(`lakeflow benchmark (%d CPUs, %s, PostgreSQL %s)
  source load:     %d changes in %d transactions, %.1f MB of WAL (%.1f s)
  pg_recvlogical:  %.2f s  = %.0f changes/s   (pgoutput decoding, the source's limit)
  lakeflow run:    %.2f s  = %.0f events/s    (WAL → Kafka → lake + silver, %d lake files)
  peak RSS:        %.0f MiB, CPU %.1f s (%.1f µs per event)
  warehouse:       %s
  ratio:           lakeflow end to end runs at %.0f%% of pg_recvlogical's drain rate
`, res.CPUs, res.GoVersion, res.PostgresVersion, res.Changes, res.Transactions, float64(res.WALBytes)/1e6, res.LoadSeconds,
		res.RecvlogicalSecs, res.RecvlogicalRate, res.LakeflowSeconds, res.LakeflowRate, res.LakeFiles,
		float64(res.LakeflowPeakRSS)/(1<<20), res.LakeflowCPUSecs, 1e6*res.LakeflowCPUSecs/float64(max(res.LakeflowEvents, 1)),
		fmt.Sprintf("stage %.2f s, decode %.2f s, lake %.2f s, merge %.2f s, commit %.2f s",
			res.Phases["stage"], res.Phases["decode"], res.Phases["lake"], res.Phases["merge"], res.Phases["commit"]),
		100*res.LakeflowRate/res.RecvlogicalRate)
	data, _ := json.MarshalIndent(res, "", "  ")
	if keep {
		fmt.Fprintln(os.Stderr, "working directory kept:", work)
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// runLakeflow runs `lakeflow run` to completion and returns its log and
// resource usage (peak RSS, CPU time).
func runLakeflow(bin, cfgFile string) (string, *syscall.Rusage, error) {
	cmd := exec.Command(bin, "--config", cfgFile, "--log-level", "debug", "run")
	var log strings.Builder
	cmd.Stderr = &log
	if err := cmd.Run(); err != nil {
		return log.String(), nil, fmt.Errorf("lakeflow run: %v\n%s", err, log.String())
	}
	os.WriteFile(filepath.Join(filepath.Dir(cfgFile), "lakeflow.log"), []byte(log.String()), 0o644)
	return log.String(), cmd.ProcessState.SysUsage().(*syscall.Rusage), nil
}

// phases adds up the per-phase durations of the "batch committed" lines.
func phases(log string) map[string]float64 {
	out := map[string]float64{}
	re := regexp.MustCompile(`(stage|decode|lake|merge|commit)=([0-9.]+[µm]?s)`)
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `msg="batch committed"`) {
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
