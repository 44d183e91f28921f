package pipeline

import (
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/postgres"
)

func TestSnapshotLine(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := &postgres.SnapshotProgress{Table: "public.orders", Index: 3, Count: 5, Estimate: 1000, Started: start}
	p.Rows.Store(250)
	if got, want := snapshotLine(p, start.Add(10*time.Second)), "snapshot public.orders (table 3 of 5): 250 rows of ~1000 (25%), about 30s left"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	p.Estimate = -1
	if got, want := snapshotLine(p, start.Add(10*time.Second)), "snapshot public.orders (table 3 of 5): 250 rows"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

func TestCopyLine(t *testing.T) {
	p := &postgres.CopyProgress{Table: "public.orders", Left: 2}
	p.Rows.Store(16384)
	if got, want := copyLine(p), "copying public.orders: 16384 rows (2 more tables to copy)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	p.Left = 0
	if got, want := copyLine(p), "copying public.orders: 16384 rows"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
