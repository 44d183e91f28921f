package pipeline

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/config"
)

// TestLiveStartsFromAnOlderLayout: a data directory whose warehouse.path
// is the warehouse itself (as lakeflow wrote it before publishing), with
// the write-ahead log a crash left, becomes the live warehouse, log and
// all; an existing live file is never overwritten.
func TestLiveStartsFromAnOlderLayout(t *testing.T) {
	dir := t.TempDir()
	cfg := &config.Config{Warehouse: config.Warehouse{Path: filepath.Join(dir, "warehouse.duckdb"), Live: filepath.Join(dir, "live.duckdb")}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for p, body := range map[string]string{cfg.Warehouse.Path: "db", cfg.Warehouse.Path + ".wal": "log"} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := ensureLive(cfg, log); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{cfg.Warehouse.Live: "db", cfg.Warehouse.Live + ".wal": "log"} {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Fatalf("%s: %q, %v; want %q", p, got, err, want)
		}
	}
	if _, err := os.Stat(cfg.Warehouse.Path + ".wal"); !os.IsNotExist(err) {
		t.Fatalf("warehouse.path keeps its log, which would be replayed onto every copy: %v", err)
	}
	if err := os.WriteFile(cfg.Warehouse.Path, []byte("newer copy"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ensureLive(cfg, log); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(cfg.Warehouse.Live); string(got) != "db" {
		t.Fatalf("the live warehouse was overwritten: %q", got)
	}
}
