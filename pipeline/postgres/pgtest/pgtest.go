// Package pgtest gives test packages a private PostgreSQL cluster (one per
// package, started in TestMain) and a fresh database per test.
package pgtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/pipeline/postgres"
)

// Server is a running test cluster.
type Server struct {
	cluster *postgres.Cluster
	dir     string
	n       atomic.Int64
}

const dirPattern = "lakeflow-pgtest-"

// Start starts a cluster with fsync off in a fresh directory. It fails
// (never skips) when the server binaries are missing, saying how to
// install them. Clusters left running by test processes that died (a
// timeout, a killed fuzz worker) are stopped first.
func Start() (*Server, error) {
	reapOrphans()
	dir, err := os.MkdirTemp("", dirPattern)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	// The server may run as the postgres user (when tests run as root):
	// the directory must be traversable for it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cl, err := postgres.StartCluster(context.Background(), postgres.ClusterConfig{
		Dir: filepath.Join(dir, "pg"), Port: port, Ephemeral: true,
	}, log)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start test PostgreSQL (install the server binaries, e.g. apt-get install postgresql): %w", err)
	}
	return &Server{cluster: cl, dir: dir}, nil
}

// Main is a test package's TestMain: it starts the cluster into *srv,
// runs the tests, runs cleanups, stops the cluster and exits.
func Main(m *testing.M, srv **Server, cleanups ...func()) {
	s, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*srv = s
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	s.Stop()
	os.Exit(code)
}

// reapOrphans stops and removes test clusters whose test process is gone.
func reapOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPattern+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || syscall.Kill(pid, 0) == nil {
			continue // malformed, or its owner still runs
		}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		if cl, err := postgres.OpenCluster(postgres.ClusterConfig{Dir: filepath.Join(dir, "pg")}, log); err == nil {
			cl.Stop()
		}
		os.RemoveAll(dir)
	}
}

// Stop stops the cluster and removes its files.
func (s *Server) Stop() {
	s.cluster.Stop()
	os.RemoveAll(s.dir)
}

// Restart stops and starts the cluster (fast shutdown: sessions end).
func (s *Server) Restart() error {
	if err := s.cluster.Stop(); err != nil {
		return err
	}
	return s.cluster.Start(context.Background())
}

// Cluster is the underlying cluster.
func (s *Server) Cluster() *postgres.Cluster { return s.cluster }

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// NewDatabase creates a database for t and returns its DSN; it is dropped
// when the test ends.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("t%d_%s", s.n.Add(1), name)
	ctx := context.Background()
	if err := s.cluster.EnsureDatabase(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, s.cluster.DSN("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		// A walsender may outlive the test's source by a moment: end it,
		// or its slot (whose name the next test may take) and the
		// database stay behind.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			conn.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active", name)
			conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active", name)
			var left int
			if conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = $1", name).Scan(&left) != nil || left == 0 {
				break
			}
		}
		conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return s.cluster.DSN(name)
}

// ReachableDir returns a new temporary directory the postgres user can
// reach, removed when the test ends (t.TempDir's parent is private, and a
// root process runs the server as postgres).
func ReachableDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Connect opens a connection that closes when the test ends.
func Connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Exec runs SQL statements against dsn, failing the test on error.
func Exec(t testing.TB, dsn string, sql ...string) {
	t.Helper()
	ctx := context.Background()
	conn := Connect(t, dsn)
	for _, s := range sql {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}
