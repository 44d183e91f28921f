package pipeline

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

var demoTables = []string{"customers", "products", "orders", "order_items", "payments"}

// process is a lakeflow command running as its own process.
type process struct {
	cmd       *exec.Cmd
	batches   chan struct{} // one value per committed batch
	streaming chan struct{} // the replication stream started
	exited    chan error
}

func start(t *testing.T, h *harness, args ...string) *process {
	t.Helper()
	return launch(t, h, exec.Command(lakeflowBinary(t), append([]string{"--config", h.file, "--log-level", "debug"}, args...)...))
}

// launch starts cmd, a lakeflow command, whose log goes to h's.
func launch(t *testing.T, h *harness, cmd *exec.Cmd) *process {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, batches: make(chan struct{}, 1<<16), streaming: make(chan struct{}, 1), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			h.logs.Write([]byte(line + "\n"))
			if strings.Contains(line, `msg="batch committed"`) {
				p.batches <- struct{}{}
			}
			if strings.Contains(line, `msg=streaming`) {
				select {
				case p.streaming <- struct{}{}:
				default:
				}
			}
		}
		p.exited <- cmd.Wait()
	}()
	return p
}

// waitStreaming waits for the replication stream to run.
func (p *process) waitStreaming(t *testing.T) {
	t.Helper()
	select {
	case <-p.streaming:
	case err := <-p.exited:
		t.Fatalf("lakeflow exited early: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("lakeflow did not stream in 2 minutes")
	}
}

// waitBatches waits for n committed batches.
func (p *process) waitBatches(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for i := 0; i < n; i++ {
		select {
		case <-p.batches:
		case err := <-p.exited:
			t.Fatalf("lakeflow exited early: %v", err)
		case <-timeout:
			t.Fatalf("no batch committed in 2 minutes")
		}
	}
}

func (p *process) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
}

// wait waits for the process to exit and returns how it did. One still
// running after runLimit is stuck: it is made to print its goroutines'
// stacks (SIGQUIT; they reach the test's log) and the test fails.
func (p *process) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.exited:
		return err
	case <-time.After(runLimit):
	}
	p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
	}
	t.Fatalf("lakeflow %s did not exit in %v", strings.Join(p.cmd.Args[1:], " "), runLimit)
	return nil
}

// TestKillDuringSnapshot kills lakeflow while the initial snapshot is
// copying a table, once it saved its progress there, then deletes rows
// the partial snapshot had delivered. The next run goes on under the same
// slot from where the snapshot stopped, not from zero: the lake holds
// the rows it had copied once, and no ghost of the deleted rows is left
// in silver.
func TestKillDuringSnapshot(t *testing.T) {
	lakeflowBinary(t)
	h := newHarness(t, qualified(demoTables)...)
	ctx := context.Background()
	if err := demo.Setup(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	const orders = 250000 // more than one save of progress
	pgtest.Exec(t, h.dsn, fmt.Sprintf(`INSERT INTO orders (id, customer_id, status, total_cents, currency)
		SELECT g, 1 + g %% 200, 'paid', g * 10, 'EUR' FROM generate_series(1000, %d) g`, orders))
	// The snapshot copies payments last: a lock on it, taken once the
	// snapshot has begun (taken before, it would hold up the slot's
	// creation), holds the snapshot there until the kill, which comes
	// once it saved its progress in orders. Small batches: several commit
	// meanwhile.
	t.Setenv("LAKEFLOW_PIPELINE_BATCH_BYTES", "1MiB")
	p := start(t, h, "run", "--follow")
	for !strings.Contains(h.logs.String(), "initial snapshot started") {
		time.Sleep(2 * time.Millisecond)
	}
	tx, err := pgtest.Connect(t, h.dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE payments IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the snapshot's progress in orders saved", func() bool {
		return strings.Contains(h.logs.String(), `msg="snapshot progress saved" table=public.orders`)
	})
	p.kill(t)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(h.logs.String(), "initial snapshot done") {
		t.Fatal("the snapshot finished before the kill")
	}
	pgtest.Exec(t, h.dsn, "DELETE FROM orders WHERE id % 7 = 0")
	p = start(t, h, "run")
	if err := p.wait(t); err != nil {
		t.Fatalf("lakeflow run: %v", err)
	}
	if !strings.Contains(h.logs.String(), "the stream goes on from its consistent point") {
		t.Fatal("the restarted run did not go on from where the snapshot stopped")
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	assertLakeExactlyOnce(t, h.cfg, demoTables...)
	// The rows saved before the kill are not read again: copied after
	// the snapshot's consistent point are at most the rest of orders.
	again := queryText(t, h.cfg.Warehouse.Path, fmt.Sprintf(`SELECT count(*) FILTER (_cdc_seq > (SELECT min(_cdc_seq) FROM read_parquet(%[1]q) WHERE op = 'r'))
		FROM read_parquet(%[1]q) WHERE op = 'r'`, filepath.Join(h.cfg.Lake.Dir, "orders", "*", "*.parquet")))
	var n int
	fmt.Sscan(again, &n)
	if n == 0 || n > orders-200000 {
		t.Errorf("%d rows of orders copied after the restart, want between 1 and %d: the snapshot did not go on from its progress", n, orders-200000)
	}
}

// TestKillDuringANewSlotsSnapshot: a new source.slot takes every table
// again, and rows deleted meanwhile must leave silver; lakeflow is killed
// once that snapshot has copied the first table, held at the second by a
// lock. The tables it had not reached go on as copies that reconcile: the
// deleted rows of the third leave silver although its snapshot never sent
// the truncate that would have removed them.
func TestKillDuringANewSlotsSnapshot(t *testing.T) {
	h := newHarness(t, "public.a", "public.b", "public.c")
	pgtest.Exec(t, h.dsn, `CREATE TABLE a (id int PRIMARY KEY, v text)`, `INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 100000) g`,
		`CREATE TABLE b (id int PRIMARY KEY)`, `INSERT INTO b SELECT generate_series(1, 10)`,
		`CREATE TABLE c (id int PRIMARY KEY, v int)`, `INSERT INTO c SELECT g, g FROM generate_series(1, 20) g`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `DELETE FROM c WHERE id <= 5`, `UPDATE c SET v = -v WHERE id > 15`)
	slot := h.cfg.Source.Slot
	setConfig(t, h, fmt.Sprintf("slot = %q", slot), fmt.Sprintf("slot = %q", slot+"_2"))
	ctx := context.Background()
	before := len(h.logs.String())
	since := func() string { return h.logs.String()[before:] }
	p := start(t, h, "run", "--follow")
	waitFor(t, "the new snapshot", func() bool { return strings.Contains(since(), "initial snapshot started") })
	tx, err := pgtest.Connect(t, h.dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE b IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a snapshotted", func() bool { return strings.Contains(since(), `msg="table snapshotted" table=public.a`) })
	time.Sleep(200 * time.Millisecond) // the snapshot waits at b
	p.kill(t)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(since(), "table=public.b") {
		t.Fatal("the snapshot went past b before the kill: the test proves nothing")
	}
	if err := start(t, h, "run").wait(t); err != nil {
		t.Fatal(err)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a", "public.b", "public.c")
	assertLakeExactlyOnce(t, h.cfg, "public.a", "public.b", "public.c")
}
