package postgres

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A root process runs PostgreSQL as the postgres user; a data_dir that
// user cannot reach (t.TempDir's parent is 0700) moves the cluster to a
// stable place under /var/tmp. Other users keep it where it is.
func TestClusterGoesWherePostgresCanReach(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "pg")
	c, err := OpenCluster(ClusterConfig{Dir: dir}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	again, err := OpenCluster(ClusterConfig{Dir: dir}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if c.Dir() != dir {
			t.Fatalf("cluster moved to %s", c.Dir())
		}
		return
	}
	if !strings.HasPrefix(c.Dir(), "/var/tmp/lakeflow-") || again.Dir() != c.Dir() {
		t.Fatalf("cluster for unreachable %s is at %s, then %s; want one stable place under /var/tmp", dir, c.Dir(), again.Dir())
	}
}

// TestClusterPortInUse: a port another process holds is named as the
// setting to change, not answered with the server's log.
func TestClusterPortInUse(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port
	dir, err := os.MkdirTemp("", "lakeflow-port-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := StartCluster(context.Background(), ClusterConfig{Dir: filepath.Join(dir, "pg"), Port: port, Ephemeral: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil {
		c.Stop()
		t.Fatal("the cluster started on a port another process holds")
	}
	want := fmt.Sprintf("source.port %d is already in use", port)
	if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "postgres.log") {
		t.Fatalf("got %q, want one line saying %q", err, want)
	}
}
