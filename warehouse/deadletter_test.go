package warehouse

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/change"
)

func (f *fixture) count(q string, args ...any) int64 {
	f.t.Helper()
	var n int64
	if err := f.wh.conn.QueryRowContext(context.Background(), q, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// TestDeadLetterFilesSurviveACrashAfterCommit: a batch committed whose
// lake files were not yet published when the process died (kill -9
// between COMMIT and the rename): the next start publishes the dead
// letters' file as it does the tables'.
func TestDeadLetterFilesSurviveACrashAfterCommit(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := batch(f.rec(change.OpCreate, 100, 1, "1", "a", ""), Record{Topic: topic, Partition: 0, Offset: f.offset, Value: []byte("not json")})
	f.offset++
	var st BatchStats
	since := laps()
	if err := f.wh.stage(ctx, b.Records); err != nil {
		t.Fatal(err)
	}
	order, rows, err := f.wh.decodeBatch(ctx, b.Records, &st, since)
	if err != nil {
		t.Fatal(err)
	}
	written, err := f.wh.writeBatchLake(ctx, b, order)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.wh.inTx(ctx, func(ctx context.Context) error {
		_, err := f.wh.applyInTx(ctx, b, written, order, rows, &st, since)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.close() // committed; the process dies before publishing
	f.open()
	defer f.close()
	if n := f.lakeEvents(); n != 1 {
		t.Fatalf("lake table events %d, want 1", n)
	}
	files, _ := filepath.Glob(filepath.Join(f.dir, "lake", "_dlq", "*", "*", "*.parquet"))
	if len(files) != 1 || f.count("SELECT count(*) FROM read_parquet(?)", files[0]) != 1 {
		t.Fatalf("the dead letter's lake file: %v", files)
	}
}
