package warehouse

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
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
	s, err := f.wh.Stage(ctx, b.Records)
	if err != nil {
		t.Fatal(err)
	}
	order, rows, err := f.wh.decodeBatch(ctx, b, s, &st, since)
	if err == nil {
		err = f.wh.narrow(ctx, order, rows)
	}
	if err != nil {
		t.Fatal(err)
	}
	lf := f.wh.writeBatchLake(ctx, b, order)
	if err := f.wh.inTx(ctx, func(ctx context.Context) error {
		_, err := f.wh.applyInTx(ctx, b, lf, order, rows, &st, since)
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

// TestRecordOfATopicWithoutASchema: a record of a topic no table schema
// names is a dead letter that keeps its topic, position and payload; the
// batch's other records are applied.
func TestRecordOfATopicWithoutASchema(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	const stray = "lf.public.stray"
	b := Batch{Records: []Record{f.rec(change.OpCreate, 100, 1, "1", "a", ""), {Topic: stray, Partition: 2, Offset: 7, Value: []byte(`{"op":"c"}`)}},
		Positions: map[string]TopicPosition{topic: {ID: "t", Next: map[int32]int64{0: f.offset}}, stray: {ID: "x", Next: map[int32]int64{2: 8}}}}
	if _, err := f.wh.Apply(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	expect(t, f.silver(), `
1 a ∅ @100/1`)
	if got := f.count(`SELECT count(*) FROM lakeflow.dlq WHERE topic = ? AND topic_id = 'x' AND "partition" = 2 AND "offset" = 7
		AND failure_stage = 'schema' AND payload = '{"op":"c"}'::BLOB`, stray); got != 1 {
		t.Fatalf("lakeflow.dlq holds %d dead letters of %s at 2/7, want 1", got, stray)
	}
}
