package kafka

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/lakeflow/lakeflow/internal/change"
)

// TestWatermarksAfterARestartMidTransaction: T1 writes tables a and b,
// T2 writes a. Before a crash only a's records of T1 and T2 reached
// Kafka; after the restart PostgreSQL re-sends T1 and T2. No watermark may
// claim T1 complete while a's bound leaves out its T1 record (a bound may
// take in T2's, written before the restart: the consumer cuts batches by
// position).
func TestWatermarksAfterARestartMidTransaction(t *testing.T) {
	brokers := fakeBroker(t)
	ctx := context.Background()
	cfg := Config{Brokers: brokers, Prefix: "lf", Partitions: 1, Database: "db"}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	col := []change.Column{{Name: "id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}, Key: true}}
	ta := &change.Table{Schema: "public", Name: "a", Columns: col}
	tb := &change.Table{Schema: "public", Name: "b", Columns: col}
	ev := func(tbl *change.Table, seq change.LSN, ord uint32, id string) *change.Event {
		return &change.Event{Table: tbl, Op: change.OpCreate, Pos: change.Position{Seq: seq, Ord: ord}, LSN: seq, Commit: 1, Snapshot: change.SnapshotNone,
			After: []change.Datum{{Text: []byte(id)}}}
	}
	// Run 1: T0 complete on both, then only a's records of T1 and T2 land.
	p1, err := NewProducer(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	p1.Event(ctx, ev(ta, 100, 1, "0"))
	p1.Event(ctx, ev(tb, 100, 2, "0"))
	p1.EndTxn(change.Boundary{Seq: 100, End: 101})
	if err := p1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p1.Event(ctx, ev(ta, 200, 1, "1"))
	p1.Event(ctx, ev(ta, 300, 1, "2"))
	p1.cl.Flush(ctx) // b's record of T1 never made it (crash)
	p1.Close()

	// Run 2: PostgreSQL re-sends T1 and T2.
	p2, err := NewProducer(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	p2.Event(ctx, ev(ta, 200, 1, "1"))
	p2.Event(ctx, ev(tb, 200, 2, "1"))
	p2.EndTxn(change.Boundary{Seq: 200, End: 201})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p2.Event(ctx, ev(ta, 300, 1, "2"))
	p2.EndTxn(change.Boundary{Seq: 300, End: 301})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p2.Close()
	assertWatermarksTrue(t, ctx, cfg, "lf.public.a", "lf.public.b")
}

// assertWatermarksTrue reads every watermark and table record and checks
// that each watermark's bounds hold every record at or before its
// position (before it, for a split mark), in every partition.
func assertWatermarksTrue(t *testing.T, ctx context.Context, cfg Config, topics ...string) {
	t.Helper()
	cl, err := newClient(cfg.Brokers)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	end := func(topic string) int64 {
		ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := ends.Lookup(topic, 0)
		return o.Offset
	}
	seqs := map[string][]uint64{}
	for _, topic := range topics {
		recs, err := readRange(ctx, cfg.Brokers, topic, 0, 0, end(topic))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			var pos struct {
				Seq uint64 `json:"_cdc_seq"`
			}
			json.Unmarshal(r.Value, &pos)
			seqs[topic] = append(seqs[topic], pos.Seq)
		}
	}
	wms, err := readRange(ctx, cfg.Brokers, WatermarkTopic(cfg.Prefix), 0, 0, end(WatermarkTopic(cfg.Prefix)))
	if err != nil {
		t.Fatal(err)
	}
	if len(wms) == 0 {
		t.Fatal("no watermark")
	}
	bounds := map[string]int64{}
	for _, r := range wms {
		var w change.Watermark
		if err := json.Unmarshal(r.Value, &w); err != nil {
			t.Fatal(err)
		}
		for topic, parts := range w.Offsets {
			bounds[topic] = parts[0]
		}
		for _, topic := range topics {
			for off, seq := range seqs[topic] {
				covered := seq <= uint64(w.Seq) && (!w.Split || seq < uint64(w.Seq))
				if covered && int64(off) >= bounds[topic] {
					t.Fatalf("watermark at %d (seq %d, split %v) bounds %s at %d, leaving out its record %d of seq %d", r.Offset, w.Seq, w.Split, topic, bounds[topic], off, seq)
				}
			}
		}
	}
}

// TestSplitMarksNeverGoBack: a snapshot taken again hands over each
// table's truncate a position before its rows, table after table; a
// long one gets split marks, and none may name a position before one
// already marked (the consumer would wait for records it has applied).
func TestSplitMarksNeverGoBack(t *testing.T) {
	brokers := fakeBroker(t)
	ctx := context.Background()
	cfg := Config{Brokers: brokers, Prefix: "lf", Partitions: 1, Database: "db"}
	p, err := NewProducer(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	col := []change.Column{{Name: "id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}, Key: true}}
	for _, name := range []string{"a", "b", "c"} {
		tbl := &change.Table{Schema: "public", Name: name, Columns: col}
		p.Event(ctx, &change.Event{Table: tbl, Op: change.OpTruncate, Pos: change.Position{Seq: 199, Ord: 1}, LSN: 200, Commit: 1})
		time.Sleep(2 * splitAfter)
		p.Event(ctx, &change.Event{Table: tbl, Op: change.OpRead, Pos: change.Position{Seq: 200, Ord: 1}, LSN: 200, Commit: 1,
			Snapshot: change.SnapshotRow, After: []change.Datum{{Text: []byte("1")}}})
		time.Sleep(2 * splitAfter)
	}
	p.EndTxn(change.Boundary{Seq: 200, End: 200})
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close()
	cl, err := newClient(cfg.Brokers)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, WatermarkTopic("lf"))
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(WatermarkTopic("lf"), 0)
	wms, err := readRange(ctx, cfg.Brokers, WatermarkTopic("lf"), 0, 0, end.Offset)
	if err != nil {
		t.Fatal(err)
	}
	var marked []change.LSN
	for _, r := range wms {
		var w change.Watermark
		if err := json.Unmarshal(r.Value, &w); err != nil {
			t.Fatal(err)
		}
		if w.Split {
			marked = append(marked, w.Seq)
		}
	}
	if len(marked) < 2 || !slices.IsSorted(marked) || len(slices.Compact(slices.Clone(marked))) != len(marked) {
		t.Fatalf("split marks at %v: want at least two, each past the one before", marked)
	}
}

// fakeBroker starts an embedded broker for the test and returns its
// address.
func fakeBroker(t *testing.T) []string {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return cluster.ListenAddrs()
}
