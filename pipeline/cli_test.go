package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// following starts `lakeflow run --follow` on the demo's schema and
// returns once it has committed its first batch.
func following(t *testing.T) (*harness, *process) {
	t.Helper()
	lakeflowBinary(t)
	h := newHarness(t, qualified(demoTables)...)
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	p := start(t, h, "run", "--follow")
	p.waitBatches(t, 1)
	return h, p
}

// TestInterruptFinishesTheBatchAndExitsZero sends SIGINT to `lakeflow run
// --follow` while a batch is being applied (a test build holds it in its
// merge): the batch commits, the run says so and exits 0, and a later run
// finds everything consistent.
func TestInterruptFinishesTheBatchAndExitsZero(t *testing.T) {
	ctx := context.Background()
	h := newDemoHarness(t)
	// The snapshot's batch, then the workload's first, held in its merge.
	cmd := lakeflowCmdAt(t, lakeflowFaultBinary(t), "", "--config", h.file, "--log-level", "debug", "run", "--follow")
	cmd.Env = append(cmd.Env, crash.HoldEnv+"="+crash.Merge+"@2")
	p := launch(t, h, cmd)
	p.waitBatches(t, 1)
	if _, err := (demo.Workload{Events: 3000, Seed: 5}).Run(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a batch held in its merge", func() bool { return strings.Contains(h.logs.String(), "holding at "+crash.Merge) })
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("lakeflow run --follow after SIGINT: %v, want exit 0", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("lakeflow did not stop within a minute of SIGINT")
	}
	if !strings.Contains(h.logs.String(), `msg=stopped`) {
		t.Fatal("no clean stop logged")
	}
	if !strings.Contains(h.logs.String(), "interrupt again to stop at once") {
		t.Fatal("the interrupt did not say what the run does now")
	}
	if _, after, _ := strings.Cut(h.logs.String(), "holding at "+crash.Merge); !strings.Contains(after, `msg="batch committed"`) {
		t.Fatal("the batch the interrupt found being applied did not commit")
	}
	// Stopped, the published warehouse is all of it, and says how the
	// run went.
	db := openDuck(t, h.cfg.Warehouse.Path)
	var reason string
	var events, batches int64
	queryRow(t, db, "SELECT exit_reason FROM lakeflow.runs ORDER BY started_at DESC LIMIT 1", &reason)
	queryRow(t, db, "SELECT sum(events) FROM lakeflow.runs", &events)
	queryRow(t, db, "SELECT (SELECT max(batch) FROM lakeflow.batches) - (SELECT batch FROM lakeflow.published)", &batches)
	db.Close()
	if reason != "interrupted" || events == 0 || batches != 0 {
		t.Fatalf("lakeflow.runs: last run %q with %d events in all; published %d batches behind the last", reason, events, batches)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	assertLakeExactlyOnce(t, h.cfg, demoTables...)
}

// TestBrokenLogPipeDoesNotStopShutdown: `run --follow 2>&1 | tee run.log`
// and Ctrl-C, which ends tee too: the log is a broken pipe when the run
// says it is stopping, and the run still stops as an interrupted one
// does (exit 0, recorded as interrupted), not killed by SIGPIPE.
func TestBrokenLogPipeDoesNotStopShutdown(t *testing.T) {
	h := newDemoHarness(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := lakeflowCmd(t, "--config", h.file, "--log-level", "debug", "run", "--follow")
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	sc := bufio.NewScanner(r)
	for sc.Scan() && !strings.Contains(sc.Text(), `msg="batch committed"`) {
	}
	r.Close() // tee is gone
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("lakeflow run --follow, its log a broken pipe, after SIGINT: %v, want exit 0", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("lakeflow did not stop within a minute of SIGINT")
	}
	db := openDuck(t, h.cfg.Warehouse.Path)
	defer db.Close()
	var reason string
	queryRow(t, db, "SELECT exit_reason FROM lakeflow.runs ORDER BY started_at DESC LIMIT 1", &reason)
	if reason != "interrupted" {
		t.Fatalf("lakeflow.runs: the run ended %q, want interrupted", reason)
	}
}

// TestDemoOnEmbeddedDefaults runs the README's demo command with only the
// ports and directory changed: embedded PostgreSQL, embedded Kafka.
func TestDemoOnEmbeddedDefaults(t *testing.T) {
	// The embedded server may run as the postgres user, which must reach
	// the directory (t.TempDir's parent is private).
	dir := pgtest.ReachableDir(t, "lakeflow-demo-")
	pgPort, _ := pgtest.FreePort()
	kafkaPort, _ := pgtest.FreePort()
	file := filepath.Join(dir, "lakeflow.toml")
	toml := fmt.Sprintf("[source]\nport = %d\n[kafka]\nlisten = \"127.0.0.1:%d\"\n", pgPort, kafkaPort)
	if err := os.WriteFile(file, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := lakeflowCmd(t, "--config", file, "run", "--demo", "--demo-events", "6000")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lakeflow run --demo: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "keeping the embedded cluster elsewhere") {
		t.Fatalf("the cluster did not stay in data_dir:\n%s", out)
	}
	if !strings.Contains(string(out), "The demo is in") || !strings.Contains(string(out), "  "+cmd.Args[0]+" asof --list\n") {
		t.Fatalf("no next steps printed, or not with the command that ran (%s):\n%s", cmd.Args[0], out)
	}
	cfg, err := config.Load(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Time travel from the lake: the recorded positions (the demo applies
	// its changes as they are made, in batches to travel between), one by
	// name, and flags after the position.
	out, err = lakeflowCmd(t, "--config", file, "asof", "--list", "--format", "csv").CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || len(lines) < 4 || lines[0] != "position,lsn,_cdc_seq,commit_ts" || !strings.HasPrefix(lines[1], "batch:") {
		t.Fatalf("lakeflow asof --list: %v\n%s", err, out)
	}
	name, _, _ := strings.Cut(lines[1], ",")
	out, err = withStderr(lakeflowCmd(t, "--config", file, "asof", name, "--table", "orders", "--format", "json", "--limit", "2").Output())
	if err != nil || strings.Count(string(out), "\n") != 2 || !strings.HasPrefix(string(out), `{"id":`) {
		t.Fatalf("lakeflow asof %s --table orders --format json --limit 2: %v\n%s", name, err, out)
	}
	cmd = lakeflowCmd(t, "--config", file, "asof", "last tuesday", "--table", "orders")
	out, err = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 8 || strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), "an LSN (0/1A2B3C4)") {
		t.Fatalf("lakeflow asof with a malformed position: exit %d, %v\n%s", cmd.ProcessState.ExitCode(), err, out)
	}
	// The demo wrote its contracts and catalog into the project, which
	// had none: its rules held changes back, its customers have history,
	// and lakeflow check, which its closing lines suggest, finds every
	// catalog entry and fails on the data alone (the workload breaks the
	// rules on purpose).
	db := openDuck(t, cfg.Warehouse.Path)
	var held, versions int
	queryRow(t, db, "SELECT count(*) FROM lakeflow.quarantine", &held)
	queryRow(t, db, "SELECT count(*) FROM silver.customers_history", &versions)
	db.Close()
	if held == 0 || versions == 0 {
		t.Fatalf("the demo in a project of its own: %d changes quarantined, %d customer versions; want its contracts applied", held, versions)
	}
	cmd = lakeflowCmd(t, "--config", file, "check")
	out, _ = cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 7 || strings.Contains(string(out), "catalog.") {
		t.Fatalf("lakeflow check after the demo: exit %d, want 7 (data only)\n%s", code, out)
	}
	// The user's next step on their own database: contracts from the
	// source (the demo's set aside).
	for _, dir := range []string{cfg.Contracts.Dir, cfg.Catalog.Dir} {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	out, err = lakeflowCmd(t, "--config", file, "contracts", "init").CombinedOutput()
	if err != nil || strings.Count(string(out), "wrote ") != 5 {
		t.Fatalf("lakeflow contracts init: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(cfg.Contracts.Dir, "orders.toml")); err != nil {
		t.Fatal(err)
	}
	// The catalog, derived from the lake and the contracts just written,
	// and its lineage naming every dataset.
	out, err = lakeflowCmd(t, "--config", file, "catalog", "init").CombinedOutput()
	if err != nil || strings.Count(string(out), "wrote ") < 20 {
		t.Fatalf("lakeflow catalog init: %v\n%s", err, out)
	}
	// Again: every entry exists, as JSON log lines say.
	cmd = lakeflowCmd(t, "--config", file, "--log-format", "json", "catalog", "init")
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	entries, said := 0, 0
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var line struct {
			Msg   string `json:"msg"`
			Count int    `json:"count"`
		}
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("--log-format json wrote %q: %v", l, err)
		}
		if line.Msg == "datasets that already have a catalog entry, left alone" {
			entries, said = line.Count, said+1
		}
	}
	if entries < 20 || said != 1 {
		t.Fatalf("--log-format json: %d entries logged in %d lines, want one line\n%s", entries, said, logs.String())
	}
	out, err = withStderr(lakeflowCmd(t, "--config", file, "catalog", "--format", "csv").Output())
	if err != nil || !strings.Contains(string(out), "silver.orders,silver,") {
		t.Fatalf("lakeflow catalog: %v\n%s", err, out)
	}
	graph, err := withStderr(lakeflowCmd(t, "--config", file, "catalog", "--lineage").Output())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		name, _, _ := strings.Cut(line, ",")
		if !strings.Contains(string(graph), `"`+name+`"`) {
			t.Errorf("the lineage graph does not name %s:\n%s", name, graph)
		}
	}
	// lakeflow check: the catalog just derived passes, with a warning for
	// each owner only a person can name (the marts', lakeflow's tables');
	// an owner left empty fails the catalog part (exit 6). The report is
	// JSON. A broken contract fails the contracts part (exit 5).
	var report struct {
		Findings []struct {
			Check    string `json:"check"`
			Dataset  string `json:"dataset"`
			Severity string `json:"severity"`
		} `json:"findings"`
		Passed map[string]int `json:"passed"`
	}
	cmd = lakeflowCmd(t, "--config", file, "check", "--only", "catalog", "--json")
	out, _ = cmd.Output()
	if cmd.ProcessState.ExitCode() != 0 || json.Unmarshal(out, &report) != nil || report.Passed == nil ||
		len(report.Findings) == 0 || report.Findings[0].Check != "catalog.owner_placeholder" || report.Findings[0].Severity != "warning" {
		t.Fatalf("lakeflow check --only catalog --json after catalog init: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	entry := filepath.Join(cfg.Catalog.Dir, "gold.daily_revenue.toml")
	data, err := os.ReadFile(entry)
	if err != nil || !bytes.Contains(data, []byte(`owner = "(to fill in)"`)) {
		t.Fatalf("%s: %v\n%s", entry, err, data)
	}
	if err := os.WriteFile(entry, bytes.Replace(data, []byte(`owner = "(to fill in)"`), []byte(`owner = ""`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd = lakeflowCmd(t, "--config", file, "check", "--only", "catalog", "--json")
	out, _ = cmd.Output()
	report.Findings = nil
	if cmd.ProcessState.ExitCode() != 6 || json.Unmarshal(out, &report) != nil ||
		len(report.Findings) == 0 || report.Findings[0].Check != "catalog.owner_missing" || report.Findings[0].Dataset != "gold.daily_revenue" {
		t.Fatalf("lakeflow check --only catalog --json with an empty owner: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	if err := os.WriteFile(filepath.Join(cfg.Contracts.Dir, "broken.toml"), []byte("table = \"public.orders\"\nowner = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd = lakeflowCmd(t, "--config", file, "check", "--only", "contracts")
	out, _ = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 5 || !strings.Contains(string(out), "broken.toml:2") {
		t.Fatalf("lakeflow check with a broken contract: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	os.Remove(filepath.Join(cfg.Contracts.Dir, "broken.toml"))
	// The run stopped its PostgreSQL; start it again to compare.
	cl, err := postgres.StartCluster(context.Background(), postgres.ClusterConfig{Dir: cfg.Source.Embedded.Dir, Port: pgPort}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	// The demo's contracts held its rule breakers back.
	assertSilverEqualsSourceExcept(t, cl.DSN(cfg.Source.Embedded.Database), cfg.Warehouse.Path,
		heldBack(t, cfg.Warehouse.Path, demoTables...), demoTables...)
}

// TestSecondInterruptStopsAtOnce: a second SIGINT, sent as soon as the
// first is taken while changes flow, ends the process by the signal
// wherever its stop had got to (the batch in flight, the run's record,
// the last copy, closing the broker), and the next run still makes
// silver the source, with each change once in the lake.
func TestSecondInterruptStopsAtOnce(t *testing.T) {
	ctx := context.Background()
	h, p := following(t)
	workload := make(chan error, 1)
	go func() {
		_, err := (demo.Workload{Events: 6000, Seed: 6, Rate: 2000}).Run(ctx, h.dsn)
		workload <- err
	}()
	p.waitBatches(t, 2)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); !strings.Contains(h.logs.String(), "interrupt again to stop at once"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first SIGINT was not taken within a minute")
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("second SIGINT: %v (lakeflow had stopped already)", err)
	}
	var exit *exec.ExitError
	if err := p.wait(t); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT {
		t.Fatalf("lakeflow run --follow after a second SIGINT: %v, want killed by SIGINT", err)
	}
	if err := <-workload; err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	assertLakeExactlyOnce(t, h.cfg, demoTables...)
}

// TestDemoRefusesTablesItDidNotCreate: run --demo on a source database
// with an orders table of its own stops before it changes anything there
// (one line naming the table and what to do, exit 2: no demo table, no
// slot, the table's replica identity untouched); the tables an earlier
// demo made pass.
func TestDemoRefusesTablesItDidNotCreate(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, qualified(demoTables)...)
	if err := applySteps(ctx, h.dsn, [][]string{{"CREATE TABLE orders (id int PRIMARY KEY, amount int)"}}); err != nil {
		t.Fatal(err)
	}
	cmd := lakeflowCmd(t, "--config", h.file, "run", "--demo", "--demo-events", "10")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), "already has orders, which the demo did not create") {
		t.Fatalf("run --demo on a database with its own orders: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	conn, err := pgx.Connect(ctx, h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var identity string
	var customers *string
	var slots int
	if err := conn.QueryRow(ctx, `SELECT (SELECT relreplident::text FROM pg_class WHERE oid = 'orders'::regclass), to_regclass('customers')::text,
		(SELECT count(*) FROM pg_replication_slots WHERE database = current_database())`).Scan(&identity, &customers, &slots); err != nil {
		t.Fatal(err)
	}
	if identity != "d" || customers != nil || slots != 0 {
		t.Fatalf("the refused demo changed the source: orders' replica identity %q, customers %v, %d slots", identity, customers, slots)
	}
	if _, err := conn.Exec(ctx, "DROP TABLE orders"); err != nil {
		t.Fatal(err)
	}
	if err := demo.Setup(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	if err := demo.CheckSource(ctx, h.dsn); err != nil {
		t.Fatalf("the demo's own tables were refused: %v", err)
	}
}

// TestRunSaysItUsesTheDefaults: lakeflow run where there is no
// lakeflow.toml says so, and where its data go, before anything else
// (here a source that cannot be reached ends it at once).
func TestRunSaysItUsesTheDefaults(t *testing.T) {
	dir := t.TempDir()
	cmd := lakeflowCmd(t, "run")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LAKEFLOW_SOURCE_DSN=postgres://lakeflow@127.0.0.1:1/none?connect_timeout=2", "LAKEFLOW_KAFKA_BROKERS=127.0.0.1:1")
	out, _ := cmd.CombinedOutput()
	first, _, _ := strings.Cut(string(out), "\n")
	if !strings.Contains(first, "no lakeflow.toml here: lakeflow runs on its built-in defaults") || !strings.Contains(first, filepath.Join(dir, "data")) {
		t.Fatalf("the first line does not say the defaults are in use, and where:\n%s", out)
	}
}

// TestAMisspelledCommandGetsTheOneMeant: a typo in a command's name is
// refused (exit 2) with the command it resembles.
func TestAMisspelledCommandGetsTheOneMeant(t *testing.T) {
	cmd := lakeflowCmd(t, "chek")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), `unknown command "chek" (did you mean check?)`) {
		t.Fatalf("lakeflow chek: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
}

// TestPsqlBetweenRuns: lakeflow psql reaches the embedded PostgreSQL when
// no run does (starting it for the session and stopping it after), so a
// user can follow a stop that asks for a statement, as here a table
// without a primary key; psql's failure is the query's (exit 8).
func TestPsqlBetweenRuns(t *testing.T) {
	dir := pgtest.ReachableDir(t, "lakeflow-psql-")
	pgPort, _ := pgtest.FreePort()
	kafkaPort, _ := pgtest.FreePort()
	file := filepath.Join(dir, "lakeflow.toml")
	toml := fmt.Sprintf("[source]\nport = %d\ntables = [\"public.notes\"]\n[kafka]\nlisten = \"127.0.0.1:%d\"\n", pgPort, kafkaPort)
	if err := os.WriteFile(file, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	psql := func(args ...string) ([]byte, error) {
		return withStderr(lakeflowCmd(t, append([]string{"--config", file, "psql", "--"}, args...)...).Output())
	}
	if out, err := psql("-c", "CREATE TABLE notes (id int NOT NULL, note text)", "-c", "INSERT INTO notes VALUES (1, 'a'), (2, 'b')"); err != nil {
		t.Fatalf("lakeflow psql -- -c …: %v\n%s", err, out)
	}
	if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", pgPort), time.Second); err == nil {
		conn.Close()
		t.Fatal("the embedded PostgreSQL still runs after the psql session")
	}
	cmd := lakeflowCmd(t, "--config", file, "run")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 3 || !strings.Contains(string(out), "table public.notes has no primary key") ||
		!strings.Contains(string(out), "psql -- -c '<statement>' runs one") {
		t.Fatalf("lakeflow run on a table without a key: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	if out, err := psql("-c", "ALTER TABLE notes ADD PRIMARY KEY (id)"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := withStderr(lakeflowCmd(t, "--config", file, "run").Output()); err != nil {
		t.Fatalf("lakeflow run after the statement: %v\n%s", err, out)
	}
	out, err := withStderr(lakeflowCmd(t, "--config", file, "sql", "--format", "csv", "SELECT count(*) FROM silver.notes").Output())
	if err != nil || string(out) != "count_star()\n2\n" {
		t.Fatalf("silver.notes after the run: %v %q", err, out)
	}
	cmd = lakeflowCmd(t, "--config", file, "psql", "--", "-c", "SELEC 1")
	out, _ = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 8 || !strings.Contains(string(out), `syntax error at or near "SELEC"`) {
		t.Fatalf("lakeflow psql with a bad statement: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
}

// TestInitMakesAProjectOfItsOwn: lakeflow init writes a project from the
// binary alone (lakeflow.toml, contracts/, catalog/, sql/gold/), keeps a
// file that is there, and the demo runs in it on the project's own files
// (the marts from its sql/gold, not the binary's).
func TestInitMakesAProjectOfItsOwn(t *testing.T) {
	dir := filepath.Join(pgtest.ReachableDir(t, "lakeflow-init-"), "shop")
	if err := os.MkdirAll(filepath.Join(dir, "contracts"), 0o755); err != nil {
		t.Fatal(err)
	}
	mine := []byte("table = \"public.orders\"\nkey = [\"id\"]\n")
	if err := os.WriteFile(filepath.Join(dir, "contracts", "orders.toml"), mine, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := withStderr(lakeflowCmd(t, "init", dir).Output())
	if err != nil || !strings.Contains(string(out), "wrote 37 files into "+dir+": catalog/ (29), contracts/ (4), lakeflow.toml, sql/gold/ (3)") ||
		!strings.Contains(string(out), "kept 1 that were there: contracts/ (1)") {
		t.Fatalf("lakeflow init: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "contracts", "orders.toml")); !bytes.Equal(got, mine) {
		t.Fatalf("lakeflow init replaced a contract that was there:\n%s", got)
	}
	if out, err := withStderr(lakeflowCmd(t, "init", dir).Output()); err != nil || !strings.Contains(string(out), "nothing written") {
		t.Fatalf("lakeflow init again: %v\n%s", err, out)
	}
	// The demo, in the project (with the demo's contract of orders back),
	// on ports of the test's.
	if err := os.Remove(filepath.Join(dir, "contracts", "orders.toml")); err != nil {
		t.Fatal(err)
	}
	if _, err := withStderr(lakeflowCmd(t, "init", dir).Output()); err != nil {
		t.Fatal(err)
	}
	pgPort, _ := pgtest.FreePort()
	kafkaPort, _ := pgtest.FreePort()
	env := append(os.Environ(), fmt.Sprintf("LAKEFLOW_SOURCE_PORT=%d", pgPort), fmt.Sprintf("LAKEFLOW_KAFKA_LISTEN=127.0.0.1:%d", kafkaPort))
	cmd := lakeflowCmd(t, "run", "--demo", "--demo-events", "2000")
	cmd.Dir, cmd.Env = dir, env
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `file=`+filepath.Join(dir, "sql", "gold", "daily_revenue.sql")) ||
		strings.Contains(string(out), "wrote the demo's") {
		t.Fatalf("lakeflow run --demo in the project: %v\n%s", err, out)
	}
	cmd = lakeflowCmd(t, "sql", "--format", "csv", "SELECT count(*) > 0 FROM gold.daily_revenue")
	cmd.Dir = dir
	if out, err := withStderr(cmd.Output()); err != nil || !strings.HasSuffix(string(out), "true\n") {
		t.Fatalf("gold.daily_revenue in the project's warehouse: %v\n%s", err, out)
	}
}

// TestAnInterruptInsideATransactionKeepsTheWholeCopy: Ctrl-C while run
// --follow applies a transaction larger than a batch, in parts, ends the
// run with the warehouse inside it; warehouse.path keeps the last copy
// that held whole transactions, and the next run completes the
// transaction and publishes it.
func TestAnInterruptInsideATransactionKeepsTheWholeCopy(t *testing.T) {
	h := newHarnessWith(t, "\n[warehouse]\npublish_interval = \"300ms\"", "public.big")
	setConfig(t, h, `batch_bytes = "4MiB"`, `batch_bytes = "1MiB"`)
	pgtest.Exec(t, h.dsn, `CREATE TABLE big (id bigint PRIMARY KEY, note text)`, `INSERT INTO big SELECT g, 'small' FROM generate_series(1, 100) g`)
	published := func() string {
		t.Helper()
		out, err := withStderr(lakeflowCmd(t, "--config", h.file, "sql", "--format", "csv",
			"SELECT (SELECT consistent FROM lakeflow.published), (SELECT count(*) FROM silver.big WHERE NOT _deleted)").Output())
		if err != nil {
			t.Fatalf("lakeflow sql: %v", err)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")[1]
	}
	p := start(t, h, "run", "--follow")
	p.waitStreaming(t)
	waitFor(t, "a copy of the first rows", func() bool {
		_, err := os.Stat(h.cfg.Warehouse.Path)
		return err == nil && strings.Contains(h.logs.String(), "batch=1 ") && published() == "true,100"
	})
	before := strings.Count(h.logs.String(), "consistent=false")
	pgtest.Exec(t, h.dsn, `INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(101, 80100) g`)
	waitFor(t, "a batch holding part of the transaction", func() bool { return strings.Count(h.logs.String(), "consistent=false") > before })
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t); err != nil {
		t.Fatalf("lakeflow run --follow after Ctrl-C: %v", err)
	}
	if got := published(); got != "true,100" || !strings.Contains(h.logs.String(), "warehouse.path is left as it was") {
		t.Fatalf("after a Ctrl-C inside the transaction, the published copy holds %s (consistent, rows), want the copy before it: true,100", got)
	}
	if err := start(t, h, "run").wait(t); err != nil {
		t.Fatalf("the next lakeflow run: %v", err)
	}
	if got := published(); got != "true,80100" {
		t.Fatalf("after the next run, the published copy holds %s, want true,80100", got)
	}
}
