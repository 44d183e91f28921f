package pipeline

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// TestWatermarkOfATableNotYetReadDoesNotStall: a watermark names a
// table whose schema arrived after the consumer last read the schema
// topic, and none will come for an hour (batch_interval): the consumer
// reads it for the watermark, instead of waiting for it forever.
func TestWatermarkOfATableNotYetReadDoesNotStall(t *testing.T) {
	ctx := context.Background()
	p, c, errc := snapshotConsumer(t, config.Pipeline{BatchEvents: 1, BatchBytes: 1 << 26, BatchInterval: time.Hour})
	for i, tbl := range []*change.Table{idTable("a"), idTable("b")} {
		if err := p.Schema(ctx, tbl); err != nil {
			t.Fatal(err)
		}
		e := snap(tbl, i)
		e.Op, e.Pos, e.Snapshot = change.OpCreate, change.Position{Seq: change.LSN(100 * (i + 1)), Ord: 1}, change.SnapshotNone
		p.Event(ctx, e)
		p.EndTxn(change.Boundary{Seq: e.Pos.Seq, End: e.Pos.Seq + 1})
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		awaitConsumer(t, c, errc, func() bool { return change.LSN(c.applied.Load()) > e.Pos.Seq })
	}
}

// TestSchemaOfATableNotYetReadWhileRecordsAreHeld: the consumer holds a
// snapshot's first table, short of batch_bytes, when the next table's
// schema and rows arrive, with no watermark until the snapshot ends (a
// lock on a later table can hold it for good): it must read that schema
// while it holds records, and apply what fills batch_bytes.
func TestSchemaOfATableNotYetReadWhileRecordsAreHeld(t *testing.T) {
	ctx := context.Background()
	p, c, errc := snapshotConsumer(t, config.Pipeline{BatchEvents: 1 << 20, BatchBytes: 4 << 10, BatchInterval: 50 * time.Millisecond})
	small, big := idTable("small"), idTable("big")
	if err := p.Schema(ctx, small); err != nil {
		t.Fatal(err)
	}
	p.Event(ctx, snap(small, 1))
	p.Flush(ctx)
	// The row is held before the next schema exists.
	awaitConsumer(t, c, errc, func() bool { return gaugeValue(t, c.metrics, "lakeflow_pending_events") == 1 })
	p.Schema(ctx, big)
	for i := range 100 {
		p.Event(ctx, snap(big, i))
	}
	p.Flush(ctx)
	awaitConsumer(t, c, errc, func() bool { return c.stats.batches.Load() > 0 })
}

// snapshotConsumer runs a consumer of pcfg over an in-memory broker, with
// the producer that feeds it.
func snapshotConsumer(t *testing.T, pcfg config.Pipeline) (*kafka.Producer, *consumer, <-chan error) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ctx := context.Background()
	kcfg := kafka.Config{Brokers: cluster.ListenAddrs(), Prefix: "lf", Partitions: 1, Database: "db", Retention: time.Hour, RetentionBytes: 1 << 30}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := kafka.NewProducer(kcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	dir := t.TempDir()
	lk, _ := lake.Open(filepath.Join(dir, "lake"))
	wh, err := warehouse.Open(ctx, config.Warehouse{Path: filepath.Join(dir, "wh.duckdb")}, lk, log)
	if err != nil {
		t.Fatal(err)
	}
	cons, _ := kafka.NewConsumer(kcfg)
	c := &consumer{cfg: pcfg, kcfg: kcfg, slot: "s", kafka: cons, wh: wh, log: log, sourceDone: make(chan struct{}), follow: true,
		metrics: newMetrics(wh)}
	cctx, cancel := context.WithCancel(ctx)
	errc, stopped := make(chan error, 1), make(chan struct{})
	go func() {
		errc <- c.run(cctx)
		close(stopped)
	}()
	t.Cleanup(func() {
		cancel()
		<-stopped
		cons.Close()
		wh.Close()
	})
	return p, c, errc
}

// awaitConsumer waits up to 30 s for done, failing if the consumer stops.
func awaitConsumer(t *testing.T, c *consumer, errc <-chan error, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("stalled: %d batches, %d events applied, slot position %d", c.stats.batches.Load(), c.stats.events.Load(), c.applied.Load())
		}
		select {
		case err := <-errc:
			t.Fatalf("consumer stopped: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// idTable is a table of one bigint key column.
func idTable(name string) *change.Table {
	return &change.Table{Schema: "public", Name: name, Columns: []change.Column{{Name: "id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}, Key: true}}}
}

// snap is a snapshot row of an idTable.
func snap(tbl *change.Table, id int) *change.Event {
	return &change.Event{Table: tbl, Op: change.OpRead, Pos: change.Position{Seq: 1000}, LSN: 1000, Commit: 1700000000000000, Snapshot: change.SnapshotRow,
		After: []change.Datum{{Text: []byte(fmt.Sprint(id))}}}
}

// TestRestartMidTransactionLosesNothing: T1 writes tables a and b, T2
// writes a; before a crash only a's records of T1 and T2 reached Kafka.
// The replay must not let a batch claim T1 complete without a's record,
// which the position floor would then drop for good.
func TestRestartMidTransactionLosesNothing(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx := context.Background()
	kcfg := kafka.Config{Brokers: cluster.ListenAddrs(), Prefix: "lf", Partitions: 1, Database: "db", Retention: time.Hour, RetentionBytes: 1 << 30}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	col := func() []change.Column {
		return []change.Column{{Name: "id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}, Key: true}}
	}
	ta := &change.Table{Schema: "public", Name: "a", Columns: col()}
	tb := &change.Table{Schema: "public", Name: "b", Columns: col()}
	ev := func(tbl *change.Table, seq change.LSN, ord uint32, id string) *change.Event {
		return &change.Event{Table: tbl, Op: change.OpCreate, Pos: change.Position{Seq: seq, Ord: ord}, LSN: seq, Commit: 1700000000000000, Snapshot: change.SnapshotNone,
			After: []change.Datum{{Text: []byte(id)}}}
	}
	p1, err := kafka.NewProducer(kcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := p1.Schema(ctx, ta); err != nil {
		t.Fatal(err)
	}
	if err := p1.Schema(ctx, tb); err != nil {
		t.Fatal(err)
	}
	p1.Event(ctx, ev(ta, 100, 1, "0"))
	p1.Event(ctx, ev(tb, 100, 2, "0"))
	p1.EndTxn(change.Boundary{Seq: 100, End: 101})
	if err := p1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// T1 (a and b) and T2 (a): only a's records reach Kafka before the crash.
	p1.Event(ctx, ev(ta, 200, 1, "1"))
	p1.Event(ctx, ev(ta, 300, 1, "2"))
	p1.Flush(ctx)
	p1.Close()

	p2, err := kafka.NewProducer(kcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	p2.Event(ctx, ev(ta, 200, 1, "1"))
	p2.Event(ctx, ev(tb, 200, 2, "1"))
	p2.EndTxn(change.Boundary{Seq: 200, End: 201})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lk, err := lake.Open(filepath.Join(dir, "lake"))
	if err != nil {
		t.Fatal(err)
	}
	whPath := filepath.Join(dir, "wh.duckdb")
	wh, err := warehouse.Open(ctx, config.Warehouse{Path: whPath}, lk, log)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := kafka.NewConsumer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	c := &consumer{cfg: config.Pipeline{BatchEvents: 50000, BatchBytes: 1 << 26, BatchInterval: 10 * time.Millisecond}, kcfg: kcfg, slot: "s",
		kafka: cons, wh: wh, log: log, sourceDone: done, follow: true}
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.run(cctx) }()
	waitApplied := func(end uint64) {
		for i := 0; c.applied.Load() < end; i++ {
			if i > 500 {
				t.Fatalf("applied stuck at %d", c.applied.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	p2.Event(ctx, ev(ta, 300, 1, "2"))
	p2.EndTxn(change.Boundary{Seq: 300, End: 301})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p2.Close()

	waitApplied(301)
	cancel()
	waitStopped(t, errc)
	cons.Close()
	// A connection or result left open would make the open below spin
	// for ever in DuckDB's instance cache (duckdb/duckdb#25965).
	if err := wh.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("duckdb", whPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for q, want := range map[string]string{
		`SELECT string_agg(id::VARCHAR, ',' ORDER BY id) FROM silver.a`:                             "0,1,2",
		`SELECT string_agg(id::VARCHAR, ',' ORDER BY id) FROM silver.b`:                             "0,1",
		`SELECT sum(events)::VARCHAR FROM lakeflow.lake_files WHERE source_table = 'public.a'`:      "3",
		`SELECT bool_and(consistent)::VARCHAR FROM lakeflow.batches WHERE events > 0 AND lsn = 300`: "true",
	} {
		var got sql.NullString
		if err := db.QueryRow(q).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got.String != want {
			t.Errorf("%s: %q, want %q", q, got.String, want)
		}
	}
}

// TestNewWarehouseOnAnExistingLake: the warehouse file is lost while lake
// and Kafka are intact; a new one read from Kafka adds nothing to the lake
// twice.
func TestNewWarehouseOnAnExistingLake(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ta := &change.Table{Schema: "public", Name: "a", Columns: []change.Column{{Name: "id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}, Key: true}}}
	ev := func(seq change.LSN, ord uint32, id string) *change.Event {
		return &change.Event{Table: ta, Op: change.OpCreate, Pos: change.Position{Seq: seq, Ord: ord}, LSN: seq, Commit: 1700000000000000, Snapshot: change.SnapshotNone,
			After: []change.Datum{{Text: []byte(id)}}}
	}
	dir := t.TempDir()
	lk, _ := lake.Open(filepath.Join(dir, "lake"))
	whPath := filepath.Join(dir, "wh.duckdb")
	cl, _ := kfake.NewCluster(kfake.NumBrokers(1))
	defer cl.Close()
	k := kafka.Config{Brokers: cl.ListenAddrs(), Prefix: "lf", Partitions: 1, Database: "db", Retention: time.Hour, RetentionBytes: 1 << 30}
	p, _ := kafka.NewProducer(k, log)
	defer p.Close()
	p.Schema(ctx, ta)
	prod := func(i int) {
		p.Event(ctx, ev(change.LSN(100*i), 1, string(rune('0'+i))))
		p.EndTxn(change.Boundary{Seq: change.LSN(100 * i), End: change.LSN(100*i + 1)})
		p.Flush(ctx)
	}
	prod(1)
	run := func(be int) {
		wh, err := warehouse.Open(ctx, config.Warehouse{Path: whPath}, lk, log)
		if err != nil {
			t.Fatal(err)
		}
		defer wh.Close()
		cons, _ := kafka.NewConsumer(k)
		defer cons.Close()
		done := make(chan struct{})
		close(done)
		c := &consumer{cfg: config.Pipeline{BatchEvents: be, BatchBytes: 1 << 26, BatchInterval: 20 * time.Millisecond}, kcfg: k, slot: "s",
			kafka: cons, wh: wh, log: log, sourceDone: done}
		if err := c.run(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run(1)
	prod(2)
	prod(3)
	run(1)
	os.Remove(whPath)
	os.Remove(whPath + ".wal")
	run(1000)
	db, _ := sql.Open("duckdb", "")
	defer db.Close()
	var n, d int64
	db.QueryRow(`SELECT count(*), count(DISTINCT (_cdc_seq, _cdc_ord)) FROM read_parquet(?)`, filepath.Join(dir, "lake", "**", "*.parquet")).Scan(&n, &d)
	if n != 3 || d != 3 {
		t.Fatalf("lake holds %d events, %d of them distinct; want 3 and 3", n, d)
	}
}

// TestBoundsSurviveARestart: after a restart of the source, a watermark's
// bounds take in records written before it that come after its position;
// its batch leaves them for a later one. The consumer is then restarted
// too, and the watermark that takes them names their partition no more
// (it has not moved): the bound the warehouse recorded must, or the
// batch would claim their position without them.
func TestBoundsSurviveARestart(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx := context.Background()
	kcfg := kafka.Config{Brokers: cluster.ListenAddrs(), Prefix: "lf", Partitions: 1, Database: "db", Retention: time.Hour, RetentionBytes: 1 << 30}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ta, tb := idTable("a"), idTable("b")
	ev := func(tbl *change.Table, seq change.LSN, id string) *change.Event {
		return &change.Event{Table: tbl, Op: change.OpCreate, Pos: change.Position{Seq: seq, Ord: 1}, LSN: seq, Commit: 1700000000000000, Snapshot: change.SnapshotNone,
			After: []change.Datum{{Text: []byte(id)}}}
	}
	p1, err := kafka.NewProducer(kcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range []*change.Table{ta, tb} {
		if err := p1.Schema(ctx, tbl); err != nil {
			t.Fatal(err)
		}
	}
	p1.Event(ctx, ev(ta, 100, "1"))
	p1.EndTxn(change.Boundary{Seq: 100, End: 101})
	if err := p1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p1.Event(ctx, ev(ta, 200, "2")) // in Kafka, but no watermark says so: a crash
	p1.Flush(ctx)
	p1.Close()

	// The source restarts at 100: T1 again (a holds it), then its end.
	p2, err := kafka.NewProducer(kcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	p2.Event(ctx, ev(ta, 100, "1"))
	p2.EndTxn(change.Boundary{Seq: 100, End: 101})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lk, err := lake.Open(filepath.Join(dir, "lake"))
	if err != nil {
		t.Fatal(err)
	}
	whPath := filepath.Join(dir, "wh.duckdb")
	consume := func(until func(c *consumer) bool) {
		t.Helper()
		wh, err := warehouse.Open(ctx, config.Warehouse{Path: whPath}, lk, log)
		if err != nil {
			t.Fatal(err)
		}
		defer wh.Close()
		cons, err := kafka.NewConsumer(kcfg)
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		c := &consumer{cfg: config.Pipeline{BatchEvents: 50000, BatchBytes: 1 << 26, BatchInterval: 10 * time.Millisecond}, kcfg: kcfg, slot: "s",
			kafka: cons, wh: wh, log: log, sourceDone: make(chan struct{}), follow: true, seq: wh.Floor()}
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- c.run(cctx) }()
		awaitConsumer(t, c, errc, func() bool { return until(c) })
		cancel()
		waitStopped(t, errc)
	}
	consume(func(c *consumer) bool { return c.applied.Load() >= 101 })
	// T2 again (a holds it), then T3 in b alone: a's bound moves no more.
	p2.Event(ctx, ev(ta, 200, "2"))
	p2.EndTxn(change.Boundary{Seq: 200, End: 201})
	p2.Event(ctx, ev(tb, 300, "3"))
	p2.EndTxn(change.Boundary{Seq: 300, End: 301})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p2.Close()
	consume(func(c *consumer) bool { return c.applied.Load() >= 301 })
	if got := queryText(t, whPath, "SELECT string_agg(id::VARCHAR, ',' ORDER BY id) FROM silver.a"); got != "1,2" {
		t.Errorf("silver.a holds %s, want 1,2", got)
	}
}

// TestResentBoundariesMoveNothingBack: after a restart PostgreSQL 15 may
// send again transactions and heartbeats the warehouse applied (it keeps
// a slot's confirmed position on disk only when a checkpoint moves the
// slot). Their watermarks, at or behind silver's position, make no batch:
// the positions lakeflow.batches records only go forward.
func TestResentBoundariesMoveNothingBack(t *testing.T) {
	p, c, errc := snapshotConsumer(t, config.Pipeline{BatchEvents: 50000, BatchBytes: 1 << 26, BatchInterval: 10 * time.Millisecond})
	ctx := context.Background()
	ta := idTable("a")
	if err := p.Schema(ctx, ta); err != nil {
		t.Fatal(err)
	}
	for i, seq := range []change.LSN{100, 200} {
		e := snap(ta, i)
		e.Op, e.Pos, e.Snapshot = change.OpCreate, change.Position{Seq: seq, Ord: 1}, change.SnapshotNone
		p.Event(ctx, e)
		p.EndTxn(change.Boundary{Seq: seq, End: seq + 1})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	awaitConsumer(t, c, errc, func() bool { return c.applied.Load() >= 201 })
	// A restarted source's first boundaries: a heartbeat and a transaction
	// the warehouse holds, then something new.
	p2, err := kafka.NewProducer(c.kcfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	p2.EndTxn(change.Boundary{Seq: 150, End: 151})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e := snap(ta, 1)
	e.Op, e.Pos, e.Snapshot = change.OpCreate, change.Position{Seq: 200, Ord: 1}, change.SnapshotNone
	p2.Event(ctx, e)
	p2.EndTxn(change.Boundary{Seq: 200, End: 201})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e = snap(ta, 2)
	e.Op, e.Pos, e.Snapshot = change.OpCreate, change.Position{Seq: 300, Ord: 1}, change.SnapshotNone
	p2.Event(ctx, e)
	p2.EndTxn(change.Boundary{Seq: 300, End: 301})
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	awaitConsumer(t, c, errc, func() bool { return c.applied.Load() >= 301 })
	db := openDuckRW(t, c.wh.Path())
	defer db.Close()
	var back int
	queryRow(t, db, `SELECT count(*) FROM (SELECT lsn, lag(lsn) OVER (ORDER BY batch) AS before FROM lakeflow.batches WHERE consistent) WHERE lsn < before`, &back)
	if back != 0 {
		t.Errorf("%d batches recorded a position behind the one before", back)
	}
}

// TestStaleSplitMarksHoldUpNothing: a split mark of a transaction silver
// holds, read again after a restart, comes after the last watermark; a
// drain ends only once the consumer holds no mark, so it must not stay.
func TestStaleSplitMarksHoldUpNothing(t *testing.T) {
	c := &consumer{cfg: config.Pipeline{BatchBytes: 1 << 20}, seq: 200, marks: []mark{{w: change.Watermark{Seq: 100, Split: true}, offset: 5}}}
	if err := c.step(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if len(c.marks) != 0 {
		t.Fatalf("the consumer still holds %d marks, among them a split mark of a transaction silver holds", len(c.marks))
	}
}

// TestAWatermarkBehindTheSplitEndsNothing: while a transaction at 300 is
// applied in parts, the source says again where it stood before it (at
// 200: a partition it opened meanwhile needs a bound). That watermark
// makes no batch, which would claim silver consistent in the middle of
// the transaction, and a split mark after it stays for its parts.
func TestAWatermarkBehindTheSplitEndsNothing(t *testing.T) {
	c := &consumer{seq: 100, splitting: 300, marks: []mark{{w: change.Watermark{Seq: 300, Split: true}, offset: 5}, {w: change.Watermark{Seq: 200}, offset: 6}}}
	if !c.idles(&c.marks[1]) {
		t.Fatal("a watermark behind the transaction being split would make a batch")
	}
	c.idle(&c.marks[1])
	if len(c.marks) != 1 || !c.marks[0].w.Split || c.seq != 200 {
		t.Fatalf("after the watermark: marks %+v, seq %d; want the split mark kept and seq 200", c.marks, c.seq)
	}
}

// TestDueWorkEndsTheBatchInFlight: under a steady load a batch is always
// in flight, the next staged as soon as the last ends; a compaction pass
// or the bookkeeping's pruning that is due makes the loop end it first,
// or they never find a moment between batches.
func TestDueWorkEndsTheBatchInFlight(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name  string
		c     *consumer
		waits bool
	}{
		{"nothing due", &consumer{follow: true, pruned: now, compactAt: now.Add(time.Minute), lake: config.Lake{CompactInterval: time.Minute}}, false},
		{"a compaction pass", &consumer{follow: true, pruned: now, compactAt: now.Add(-time.Second), lake: config.Lake{CompactInterval: time.Minute}}, true},
		{"compaction off", &consumer{follow: true, pruned: now, compactAt: now.Add(-time.Second)}, false},
		{"pruning", &consumer{follow: true, pruned: now.Add(-pruneInterval), compactAt: now.Add(time.Minute)}, true},
	} {
		if got := tc.c.waitsBetween(); got != tc.waits {
			t.Errorf("%s: waitsBetween %v, want %v", tc.name, got, tc.waits)
		}
	}
}
