package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &pg, binaryCleanup) }

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
	binaryDir  string
)

// lakeflowBinary builds the command once, for tests that need a process
// they can kill.
func lakeflowBinary(t *testing.T) string {
	t.Helper()
	binaryOnce.Do(func() {
		binaryDir, binaryErr = os.MkdirTemp("", "lakeflow-bin-")
		if binaryErr != nil {
			return
		}
		binaryPath = filepath.Join(binaryDir, "lakeflow")
		out, err := exec.Command("go", "build", "-o", binaryPath, "github.com/lakeflow/lakeflow").CombinedOutput()
		if err != nil {
			binaryErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binaryErr != nil {
		t.Fatal(binaryErr)
	}
	return binaryPath
}

// lakeflowCmd is the lakeflow command with args, bounded: one still
// running after runLimit prints its goroutines' stacks to its stderr
// (SIGQUIT) and ends. (With Output, withStderr puts them in the error.)
func lakeflowCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	bin := lakeflowBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), runLimit)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// withStderr is Output's result, with what the command printed to stderr
// in the error, if it failed.
func withStderr(out []byte, err error) ([]byte, error) {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		err = fmt.Errorf("%w\n%s", err, ee.Stderr)
	}
	return out, err
}

func binaryCleanup() {
	if binaryDir != "" {
		os.RemoveAll(binaryDir)
	}
}

// harness is one pipeline under test: its own database, slot, data
// directory and broker port.
type harness struct {
	dsn  string
	dir  string
	file string
	cfg  *config.Config
	log  *slog.Logger
	logs *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHarness(t *testing.T, tables ...string) *harness {
	t.Helper()
	return newHarnessWith(t, "", tables...)
}

// newHarnessWith adds extra TOML (under the [kafka] section) to the
// harness's configuration.
func newHarnessWith(t *testing.T, kafkaTOML string, tables ...string) *harness {
	t.Helper()
	h := &harness{dsn: pg.NewDatabase(t), dir: t.TempDir(), logs: &syncBuffer{}}
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	db, err := postgres.DatabaseName(h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(tables))
	for i, tb := range tables {
		quoted[i] = fmt.Sprintf("%q", tb)
	}
	h.file = filepath.Join(h.dir, "lakeflow.toml")
	toml := fmt.Sprintf(`data_dir = "data"
[source]
dsn = %q
tables = [%s]
slot = %q
heartbeat = "1s"
[pipeline]
batch_events = 3000
batch_bytes = "4MiB"
batch_interval = "200ms"
[kafka]
listen = "127.0.0.1:%d"
%s
`, h.dsn, strings.Join(quoted, ", "), "s_"+db, port, kafkaTOML)
	if err := os.WriteFile(h.file, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if h.cfg, err = config.Load(h.file, nil); err != nil {
		t.Fatal(err)
	}
	h.log = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lakeflow log:\n%s", h.logs.String())
		}
	})
	return h
}

// run runs the pipeline in this process.
func (h *harness) run(t *testing.T, opts Options) {
	t.Helper()
	if err := runWatched(t, h.cfg, opts, h.log); err != nil {
		t.Fatalf("lakeflow run: %v", err)
	}
}

// runWatched is Run, watched: a run that hangs is cancelled, and one that
// does not stop then ends the test binary with every goroutine's stack,
// naming the test (a hang fails where it happens instead of at the
// package's timeout).
func runWatched(t *testing.T, cfg *config.Config, opts Options, log *slog.Logger) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
			return
		case <-time.After(runLimit):
			log.Error("the run did not end in time: cancelled", "limit", runLimit)
			cancel()
		}
		select {
		case <-done:
		case <-time.After(stopLimit):
			stuck(t, fmt.Sprintf("lakeflow run neither ended in %v nor stopped %v after it was cancelled", runLimit, stopLimit))
		}
	}()
	err := Run(ctx, cfg, opts, log)
	if ctx.Err() != nil {
		t.Fatalf("lakeflow run did not end in %v (%v)", runLimit, err)
	}
	return err
}

// stuck ends the test binary with every goroutine's stack: what the test
// waits for will never come, and the package's timeout would only say so
// much later, without the test's name.
func stuck(t *testing.T, what string) {
	debug.SetTraceback("all")
	panic(t.Name() + ": " + what)
}

// waitStopped waits for the error of a pipeline (Run, a consumer) that was
// told to stop.
func waitStopped(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(stopLimit):
		stuck(t, fmt.Sprintf("the pipeline did not stop %v after it was cancelled", stopLimit))
		return nil
	}
}

// runLimit is far beyond any test's run, on the slowest machine: a run
// still going then is stuck. stopLimit is as far beyond a stop (which
// applies what is held, within finishTimeout, and publishes).
const (
	runLimit  = 5 * time.Minute
	stopLimit = 3 * time.Minute
)

// applySteps runs each step (a list of statements) as one transaction.
func applySteps(ctx context.Context, dsn string, steps [][]string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, step := range steps {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		for _, s := range step {
			if _, err := tx.Exec(ctx, s); err != nil {
				tx.Rollback(ctx)
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// newDemoHarness is a harness on the demo's tables, their schema created
// in the source.
func newDemoHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, qualified(demoTables)...)
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	return h
}

// demoWorkload is a run that makes w's changes once the stream runs.
func demoWorkload(w demo.Workload) Options {
	return Options{Workload: func(ctx context.Context, dsn string) error {
		_, err := w.Run(ctx, dsn)
		return err
	}}
}
