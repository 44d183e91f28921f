package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// Faults of the machine and the services around lakeflow, each with the
// outcome the README states.

// smallDisk mounts a file system of size (tmpfs) for the test; fill fills
// all of it but room (in bytes) with a file the func it returns removes.
func smallDisk(t *testing.T, size string) (dir string, fill func(room int64) (free func())) {
	t.Helper()
	dir = pgtest.ReachableDir(t, "lakeflow-disk-")
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("this test mounts a small tmpfs to fill its disk, which needs root: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir, func(room int64) func() { return fillDisk(t, dir, room) }
}

// fillDisk fills all of dir's file system but room bytes with a file the
// returned func removes.
func fillDisk(t *testing.T, dir string, room int64) (free func()) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<16)
	for left := int64(st.Bavail)*int64(st.Bsize) - room; left > 0; left -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
			break
		}
	}
	f.Close()
	return func() {
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
	}
}

// bigRows is a workload of rows whose text does not compress.
func bigRows(from, n int) Options {
	return Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{{fmt.Sprintf(
			`INSERT INTO t SELECT g, (SELECT string_agg(md5(random()::text || g.g || k), '') FROM generate_series(1, 8) k) FROM generate_series(%d, %d) g`, from, from+n-1)}})
	}}
}

// TestDiskFullUnderTheLake: the lake's disk fills mid-run. The run stops
// with the reason (exit 3), nothing half-committed; once space is freed,
// the next run goes on from where the last batch committed.
func TestDiskFullUnderTheLake(t *testing.T) {
	diskFills(t, "16M", 1<<20, 20000, func(cfg *config.Config, dir string) { cfg.Lake.Dir = filepath.Join(dir, "lake") })
}

// TestDiskFullUnderTheWarehouse: the live warehouse's disk fills mid-run.
// The run stops with the reason (exit 3); the warehouse holds the batches
// that committed, and once space is freed the next run goes on. (The
// disk is large beside what the runs write: the next run's checkpoint
// writes what the log holds before it frees the log, and under load the
// log held up to half of a 24 MiB disk.)
func TestDiskFullUnderTheWarehouse(t *testing.T) {
	diskFills(t, "64M", 4<<20, 40000, func(cfg *config.Config, dir string) { cfg.Warehouse.Live = filepath.Join(dir, "live.duckdb") })
}

// diskFills puts what place says on a small disk (size, with slack bytes
// to free), fills it with rows big rows and checks the run stops saying
// so, and that once space is freed the next run loses nothing.
func diskFills(t *testing.T, size string, slack int64, rows int, place func(cfg *config.Config, dir string)) {
	t.Helper()
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v text)`, `ALTER TABLE t REPLICA IDENTITY FULL`)
	dir, fill := smallDisk(t, size)
	place(h.cfg, dir)
	h.run(t, bigRows(1, 100))
	// Filled once the first run has made its files: slack is what they
	// may grow by.
	free := fill(slack)
	err := runWatched(t, h.cfg, bigRows(1000, rows), h.log)
	if !errors.Is(err, fault.ErrEnvironment) || !strings.Contains(err.Error(), "No space left on device") {
		t.Fatalf("want a stop saying the disk is full, got %v", err)
	}
	free()
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	assertLakeExactlyOnce(t, h.cfg, "public.t")
}

// TestPostgresRestartedMidStream: PostgreSQL restarts while changes
// stream; the source reconnects with backoff, and nothing is lost.
func TestPostgresRestartedMidStream(t *testing.T) {
	h := newDemoHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, h.cfg, Options{Follow: true}, h.log) }()
	waitFor(t, "the stream", func() bool { return strings.Contains(h.logs.String(), "msg=streaming") })
	if _, err := (demo.Workload{Events: 2000, Seed: 31}).Run(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := (demo.Workload{Events: 2000, Seed: 32}).Run(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := waitStopped(t, errc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(h.logs.String(), "source connection lost; reconnecting") {
		t.Error("the source never said it lost its connection: the restart was not seen")
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	assertLakeExactlyOnce(t, h.cfg, demoTables...)
}

// TestPostgresRestartedMidSnapshot: PostgreSQL restarts while the initial
// snapshot copies a table. The run stops (exit 3, the source went away);
// the next takes the snapshot again, and silver is the source.
func TestPostgresRestartedMidSnapshot(t *testing.T) {
	h := newHarness(t, "public.t", "public.u")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v text)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`CREATE TABLE u (id int PRIMARY KEY, v text)`, `ALTER TABLE u REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, 't' || g FROM generate_series(1, 200000) g`, `INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 1000) g`)
	errc := make(chan error, 1)
	go func() { errc <- runWatched(t, h.cfg, Options{}, h.log) }()
	// The snapshot waits at the second table, locked while the first is
	// copied, until PostgreSQL restarts under it.
	waitFor(t, "the snapshot", func() bool { return strings.Contains(h.logs.String(), "initial snapshot started") })
	tx, err := pgtest.Connect(t, h.dsn).Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), "LOCK TABLE u IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the snapshot's first table", func() bool { return strings.Contains(h.logs.String(), `msg="table snapshotted" table=public.t`) })
	if strings.Contains(h.logs.String(), `table=public.u`) {
		t.Fatal("the snapshot took u before the lock: the test proves nothing")
	}
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := waitStopped(t, errc); !errors.Is(err, fault.ErrUnavailable) {
		t.Fatalf("want the run stopped as the source went away, got %v", err)
	}
	pgtest.Exec(t, h.dsn, `DELETE FROM t WHERE id <= 10`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t", "public.u")
}

// TestSecondRunOnTheSameDataDir: a second lakeflow run, or a backfill, on
// a data directory a run works in is refused at once (exit 3), naming
// the lock.
func TestSecondRunOnTheSameDataDir(t *testing.T) {
	h, p := following(t)
	defer p.kill(t)
	out, err := lakeflowCmd(t, "--config", h.file, "run").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(string(out), "another lakeflow is running on data_dir") {
		t.Errorf("a second lakeflow run: %v, want exit 3 naming the lock\n%s", err, out)
	}
	if _, err := Backfill(context.Background(), h.cfg, BackfillOptions{All: true}, h.log); !errors.Is(err, fault.ErrEnvironment) ||
		!strings.Contains(err.Error(), "does not run beside lakeflow run") {
		t.Errorf("a backfill beside a run: %v, want it refused", err)
	}
}
