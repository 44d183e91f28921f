package lake

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
)

// TestABuildKilledIsClearedAndWaitedFor: what a kill leaves of a
// checkpoint's build (the file, and DuckDB's spill directory with files
// in it) is removed when the next build begins, and counts as a build
// begun for the schedule; only whole checkpoints are listed, newest
// first, and a published one is durable under its position's name.
func TestABuildKilledIsClearedAndWaitedFor(t *testing.T) {
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !l.LastBuildBegun().IsZero() {
		t.Fatal("a lake with no checkpoint has a build begun")
	}
	path, err := l.BuildCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	spill := path + ".123.tmp.tmp"
	if err := os.MkdirAll(spill, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path, path + ".123.tmp", filepath.Join(spill, "duckdb_temp_block-1.block")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if begun := l.LastBuildBegun(); time.Since(begun) > time.Minute {
		t.Errorf("a build a kill left is not counted as begun (%v)", begun)
	}
	if cps, err := l.Checkpoints(); err != nil || len(cps) != 0 {
		t.Fatalf("a build a kill left is listed as a checkpoint: %v, %v", cps, err)
	}
	again, err := l.BuildCheckpoint()
	if err != nil {
		t.Fatalf("the next build: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(again))
	if len(entries) != 0 {
		t.Fatalf("the next build left %d entries of the one killed", len(entries))
	}
	for _, seq := range []uint64{0x20, 0x100} {
		if err := os.WriteFile(again, []byte("state"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := l.PublishCheckpoint(again, change.LSN(seq)); err != nil {
			t.Fatal(err)
		}
	}
	cps, err := l.Checkpoints()
	if err != nil || len(cps) != 2 || cps[0].Seq != 0x100 || filepath.Base(cps[0].Path) != "0000000000000100.duckdb" {
		t.Fatalf("checkpoints %v (%v), want the two, newest first", cps, err)
	}
}
