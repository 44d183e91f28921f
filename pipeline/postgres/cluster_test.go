package postgres

import (
	"io"
	"log/slog"
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
