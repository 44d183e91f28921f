package pipeline

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/warehouse"
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

// TestPublisherCopiesBetweenBatches: a due copy is made at once, between
// batches, and published beside the stream; the next copy waits for its
// interval.
func TestPublisherCopiesBetweenBatches(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	lk, err := lake.Open(filepath.Join(dir, "lake"))
	if err != nil {
		t.Fatal(err)
	}
	wh, err := warehouse.Open(ctx, config.Warehouse{Path: filepath.Join(dir, "live.duckdb"), MemoryLimit: 256 << 20}, lk, log)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	p := &publisher{wh: wh, path: filepath.Join(dir, "warehouse.duckdb"), interval: time.Hour, log: log}
	if err := p.due(ctx, false); err != nil {
		t.Fatal(err)
	}
	if p.running == nil {
		t.Fatal("a due copy was not made")
	}
	exists := func() bool { _, err := os.Stat(p.path); return err == nil }
	for deadline := time.Now().Add(time.Minute); !exists() || p.running != nil; time.Sleep(10 * time.Millisecond) {
		if err := p.due(ctx, false); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing published in a minute")
		}
	}
	if wh.Unpublished() {
		t.Error("the copy does not count as published")
	}
	if err := p.due(ctx, false); err != nil || p.running != nil {
		t.Errorf("a copy began before its interval (%v)", err)
	}
}

// TestPublisherWaitsOnlyForWhatItCanUse: the consumer ends the batch being
// applied early only for a copy that batch allows (one due by the clock,
// after a consistent batch) or for the outcome of the copy published:
// otherwise a backlog of batches cut inside large transactions would
// apply one batch at a time.
func TestPublisherWaitsOnlyForWhatItCanUse(t *testing.T) {
	p := &publisher{next: time.Now().Add(time.Hour), nextBehind: time.Now().Add(-time.Second)}
	for _, c := range []struct {
		behind, consistent, want bool
	}{{false, true, false}, {true, true, true}, {true, false, false}} {
		if got := p.waiting(c.behind, c.consistent); got != c.want {
			t.Errorf("waiting(behind %t, consistent %t) = %t, want %t", c.behind, c.consistent, got, c.want)
		}
	}
	p.running = make(chan error, 1)
	if p.waiting(true, true) {
		t.Error("waiting while the copy is being published")
	}
	p.running <- nil
	if !p.waiting(false, false) {
		t.Error("not waiting for the published copy's outcome")
	}
	if (*publisher)(nil).waiting(true, true) {
		t.Error("waiting without a publisher")
	}
}

// TestMetricsStartWhereTheWarehouseStands: after a restart the consistent
// position is the warehouse's, before any batch of the run.
func TestMetricsStartWhereTheWarehouseStands(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	lk, err := lake.Open(filepath.Join(dir, "lake"))
	if err != nil {
		t.Fatal(err)
	}
	wh, err := warehouse.Open(ctx, config.Warehouse{Path: filepath.Join(dir, "live.duckdb"), MemoryLimit: 256 << 20}, lk,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	if err := wh.SetFloor(ctx, 4242, 0); err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, newMetrics(wh), "lakeflow_consistent_cdc_seq"); got != 4242 {
		t.Fatalf("lakeflow_consistent_cdc_seq at start: %v, want 4242", got)
	}
}

// gaugeValue is what m's registry reports for the gauge called name, or
// -1 when it has none.
func gaugeValue(t *testing.T, m *metrics, name string) float64 {
	t.Helper()
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
