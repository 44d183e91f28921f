package pipeline

import (
	"context"
	"os"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// TestLostWarehouseIsReplayedFromKafka: with the warehouse files deleted
// and lake and Kafka kept, the next run rebuilds silver from Kafka without
// writing the lake again, and the batches it commits from then on are
// numbered after those the lake's files name, so batch:N names one
// position.
func TestLostWarehouseIsReplayedFromKafka(t *testing.T) {
	h := newDemoHarness(t)
	ctx := context.Background()
	// Paced, so that the first run commits more batches than the replay
	// does: numbered from 1 again, the run after it would reuse theirs.
	workload := func(seed uint64) Options { return demoWorkload(demo.Workload{Events: 1500, Seed: seed, Rate: 1500}) }
	h.run(t, workload(61))
	before, err := AsOfBatches(ctx, h.cfg, 1000, h.log)
	if err != nil || len(before) == 0 {
		t.Fatalf("batches the lake names: %v, %v", before, err)
	}
	for _, p := range []string{h.cfg.Warehouse.Live, h.cfg.Warehouse.Path} {
		for _, f := range []string{p, p + ".wal"} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, qualified(demoTables)...)
	h.run(t, workload(62))
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, qualified(demoTables)...)
	assertLakeExactlyOnce(t, h.cfg, qualified(demoTables)...)
	after, err := AsOfBatches(ctx, h.cfg, 1000, h.log)
	if err != nil {
		t.Fatal(err)
	}
	names := map[int64]change.LSN{}
	for _, b := range after {
		names[b.Batch] = b.Seq
	}
	for _, b := range before {
		if got := names[b.Batch]; got != b.Seq {
			t.Fatalf("batch:%d named %s before the warehouse was lost, %s now", b.Batch, b.Seq, got)
		}
	}
	// Newest first: numbers and positions fall together.
	for i := 1; i < len(after); i++ {
		if after[i].Batch >= after[i-1].Batch || after[i].Seq > after[i-1].Seq {
			t.Fatalf("batch %d at %s listed after batch %d at %s: a number names two positions, or goes back", after[i].Batch, after[i].Seq, after[i-1].Batch, after[i-1].Seq)
		}
	}
}
