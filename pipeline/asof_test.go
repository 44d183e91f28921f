package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// moment is the source at one point between transactions: its WAL
// position and clock, a copy of every table (in schema copy), and, when
// the stream had applied exactly that much, a copy of its warehouse.
type moment struct {
	lsn    change.LSN
	at     time.Time
	copy   string
	stream string
}

// record takes a moment of the source (from any goroutine) and adds it
// to moments.
func record(ctx context.Context, dsn string, moments *[]moment) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	m := moment{copy: fmt.Sprintf("moment%d", len(*moments))}
	// The insert position: with synchronous_commit off a committed
	// transaction's commit record may lie past the write position.
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text, clock_timestamp()").Scan(&lsn, &m.at); err != nil {
		return err
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return err
	}
	m.lsn = change.LSN(l)
	stmts := []string{"CREATE SCHEMA " + m.copy}
	for _, tb := range demoTables {
		stmts = append(stmts, fmt.Sprintf("CREATE TABLE %s.%s AS TABLE public.%s", m.copy, tb, tb))
	}
	*moments = append(*moments, m)
	return applySteps(ctx, dsn, [][]string{stmts})
}

// recordEnd records a moment at the end of a run, with the stream's
// warehouse.
func recordEnd(t *testing.T, h *harness, moments *[]moment) {
	t.Helper()
	if err := record(context.Background(), h.dsn, moments); err != nil {
		t.Fatal(err)
	}
	keepStream(t, h, &(*moments)[len(*moments)-1])
}

// keepStream copies the stream's warehouse (closed: the run returned).
func keepStream(t *testing.T, h *harness, m *moment) {
	t.Helper()
	data, err := os.ReadFile(h.cfg.Warehouse.Path)
	if err != nil {
		t.Fatal(err)
	}
	m.stream = filepath.Join(h.dir, m.copy+".duckdb")
	if err := os.WriteFile(m.stream, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ruleBreakers are the keys of the rows that break the demo's rules at
// some moment of asofWorkload: as of then, silver holds their previous
// version (or none), so they are left out of the comparison with the
// source; the comparison with the stream covers them.
var ruleBreakers = map[string]string{
	"orders":    "id IN (900100, 900101, 900002)",
	"customers": "id = 3",
}

// TestAsOfEqualsTheSourceAtEveryMoment: the demo shop in three runs,
// with moments recorded in the middle of runs and at their ends; lakeflow
// asof at each moment's LSN, _cdc_seq and time gives the source as it was
// then (rule breakers excepted), and at the ends of runs the very
// warehouse the stream had: silver, history, quarantine and gold marts.
func TestAsOfEqualsTheSourceAtEveryMoment(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, qualified(demoTables)...)
	useDemoContracts(t, h)
	if err := demo.Setup(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	var moments []moment
	mix := func(seed uint64) error {
		_, err := demo.Workload{Events: 1200, Seed: seed, Clean: true}.Run(ctx, h.dsn)
		return err
	}
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		if err := mix(31); err != nil {
			return err
		}
		if err := record(ctx, dsn, &moments); err != nil {
			return err
		}
		return mix(32)
	}})
	recordEnd(t, h, &moments)
	checkpoints := []change.LSN{writeCheckpoint(t, h)}
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		err := applySteps(ctx, dsn, [][]string{
			{`UPDATE orders SET status = 'cancelled' WHERE id IN (SELECT id FROM orders WHERE status = 'paid' ORDER BY id LIMIT 5)`},
			{`DELETE FROM order_items WHERE order_id = (SELECT min(id) FROM orders)`, `DELETE FROM orders WHERE id = (SELECT min(id) FROM orders)`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency, created_at) VALUES (900001, 2, 'shipped', 4242, 'EUR', now() - INTERVAL '6 days')`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (900002, 1, 'paid', 500, 'EUR')`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (900100, 1, 'paid', -5, 'EUR')`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (900101, 999999, 'paid', 500, 'EUR')`},
			{`UPDATE orders SET status = 'lost' WHERE id = 900002`},
			{`UPDATE customers SET email = 'broken' WHERE id = 3`},
		})
		if err != nil {
			return err
		}
		if err := record(ctx, dsn, &moments); err != nil {
			return err
		}
		return applySteps(ctx, dsn, [][]string{
			{`UPDATE orders SET status = 'delivered' WHERE id = 900002`},
			{`UPDATE customers SET email = 'fixed@example.com' WHERE id = 3`},
			{`DELETE FROM orders WHERE id = 900001`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency, created_at) VALUES (900001, 4, 'paid', 99, 'EUR', now() - INTERVAL '2 days')`},
		})
	}})
	recordEnd(t, h, &moments)
	// The second checkpoint starts from the first: a chain.
	checkpoints = append(checkpoints, writeCheckpoint(t, h))
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error { return mix(33) }})
	recordEnd(t, h, &moments)

	// Each as-of state starts from the newest checkpoint at or before its
	// position, and is what the stream had, what the source had: a
	// replay from a checkpoint is the replay from the lake's start.
	startedFrom := map[change.LSN]int{}

	for i, m := range moments {
		forms := map[string]string{
			"lsn":      m.lsn.String(),
			"_cdc_seq": strconv.FormatUint(uint64(m.lsn), 10),
			"time":     m.at.Format(time.RFC3339Nano),
		}
		for form, pos := range forms {
			out := filepath.Join(h.dir, fmt.Sprintf("asof-%d-%s.duckdb", i, strings.Trim(form, "_")))
			a, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: pos, Out: out}, h.log)
			if err != nil {
				t.Fatalf("moment %d, asof %s %s: %v", i, form, pos, err)
			}
			a.Close()
			want := change.LSN(0)
			for _, c := range checkpoints {
				if c <= a.Bound.Seq {
					want = c
				}
			}
			if a.From != want {
				t.Errorf("moment %d, asof %s %s (at %d) started from the checkpoint at %d, want %d (checkpoints %v)", i, form, pos, uint64(a.Bound.Seq), uint64(a.From), uint64(want), checkpoints)
			}
			startedFrom[a.From]++
			tables := make([]string, len(demoTables))
			for j, tb := range demoTables {
				tables[j] = m.copy + "." + tb
			}
			assertSilverEqualsSourceExcept(t, h.dsn, out, ruleBreakers, tables...)
			if m.stream != "" && form == "lsn" {
				db := attachBoth(t, m.stream, out)
				for _, table := range []string{"silver.customers", "silver.products", "silver.orders", "silver.order_items", "silver.payments",
					"silver.customers_history", "gold.daily_revenue", "gold.product_ranks", "gold.customer_ltv"} {
					assertSameRows(t, db, table, "*")
				}
				var held int
				queryRow(t, db, "SELECT count(*) FROM a.lakeflow.quarantine", &held)
				if held > 0 {
					assertSameRows(t, db, "lakeflow.quarantine", "* EXCLUDE (quarantined_at)")
				} else if queryRow(t, db, "SELECT count(*) FROM b.lakeflow.quarantine", &held); held > 0 {
					t.Errorf("moment %d: asof quarantined %d changes, the stream none", i, held)
				}
				db.Close()
			}
		}
	}
	for _, c := range append(checkpoints, 0) {
		if startedFrom[c] == 0 {
			t.Errorf("no asof started from the checkpoint at %d (0: the lake's start): %v", uint64(c), startedFrom)
		}
	}
	assertAsOfPositions(t, ctx, h, moments)
	assertCheckpointsPassedOver(t, ctx, h, moments[len(moments)-1])
}

// writeCheckpoint writes a state checkpoint of the lake, and returns its
// position.
func writeCheckpoint(t *testing.T, h *harness) change.LSN {
	t.Helper()
	st, err := BuildCheckpoint(context.Background(), h.cfg, h.log)
	if err != nil || !st.Written {
		t.Fatalf("write a checkpoint: %+v, %v", st, err)
	}
	return st.Seq
}

// assertCheckpointsPassedOver: an as-of state does not start from a
// checkpoint that cannot be read, nor from one written under other
// contracts, and is still the stream's.
func assertCheckpointsPassedOver(t *testing.T, ctx context.Context, h *harness, last moment) {
	t.Helper()
	lk, err := lake.OpenExisting(h.cfg.Lake.Dir)
	if err != nil {
		t.Fatal(err)
	}
	cps, err := lk.Checkpoints()
	if err != nil || len(cps) != checkpointsKept {
		t.Fatalf("the lake keeps checkpoints %v (%v), want the newest %d", cps, err, checkpointsKept)
	}
	asof := func(what string, from change.LSN) {
		t.Helper()
		out := filepath.Join(t.TempDir(), "asof.duckdb")
		a, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: last.lsn.String(), Out: out}, h.log)
		if err != nil {
			t.Fatalf("asof with %s: %v", what, err)
		}
		a.Close()
		if a.From != from {
			t.Errorf("asof with %s started from the checkpoint at %d, want %d", what, uint64(a.From), uint64(from))
		}
		db := attachBoth(t, last.stream, out)
		defer db.Close()
		assertSameRows(t, db, "silver.orders", "*")
		assertSameRows(t, db, "lakeflow.quarantine", "* EXCLUDE (quarantined_at)")
	}
	// A newer one that is no DuckDB file: passed over, said in the log.
	bad := filepath.Join(filepath.Dir(cps[0].Path), fmt.Sprintf("%016X.duckdb", uint64(cps[0].Seq)+1))
	if err := os.WriteFile(bad, []byte("not a database"), 0o644); err != nil {
		t.Fatal(err)
	}
	asof("a checkpoint that cannot be read", cps[0].Seq)
	if !strings.Contains(h.logs.String(), "a state checkpoint of the lake cannot be read") {
		t.Error("the checkpoint that cannot be read is not said in the log")
	}
	os.Remove(bad)
	// Other contracts: a rule's check changed, and none fits.
	file := filepath.Join(h.cfg.Contracts.Dir, "orders.toml")
	body, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(body), "total_cents >= 0", "total_cents >= 0 AND total_cents >= -1", 1)
	if changed == string(body) {
		t.Fatal("orders.toml has no rule total_cents >= 0 to change")
	}
	if err := os.WriteFile(file, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(file, body, 0o644)
	asof("other contracts", 0)
}

// assertAsOfPositions checks the other forms of a position, and those
// outside the lake.
func assertAsOfPositions(t *testing.T, ctx context.Context, h *harness, moments []moment) {
	t.Helper()
	last := moments[len(moments)-1]
	bound := func(pos string) *AsOf {
		t.Helper()
		a, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: pos, Table: "payments"}, h.log)
		if err != nil {
			t.Fatalf("asof %s: %v", pos, err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	// A Kafka record: the state just after its transaction.
	db := openDuck(t, last.stream)
	var topic string
	var offset int64
	var seq uint64
	queryRow(t, db, "SELECT topic FROM lakeflow.tables WHERE source_table = 'public.orders'", &topic)
	if err := db.QueryRow(fmt.Sprintf(`SELECT kafka_offset, _cdc_seq FROM read_parquet('%s/orders/*/*.parquet')
		WHERE _cdc_seq <= %d ORDER BY kafka_offset DESC LIMIT 1 OFFSET 100`, h.cfg.Lake.Dir, uint64(moments[1].lsn))).Scan(&offset, &seq); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if a := bound(fmt.Sprintf("%s:0:%d", topic, offset)); a.Bound.Seq != change.LSN(seq) || a.After {
		t.Errorf("asof %s:0:%d is as of %s (after: %v), want the record's own position %s", topic, offset, a.Bound.Seq, a.After, change.LSN(seq))
	}
	// The positions the pipeline recorded, by name.
	bs, err := AsOfBatches(ctx, h.cfg, 3, h.log)
	if err != nil || len(bs) != 3 || bs[0].Batch <= bs[1].Batch || bs[0].Seq > last.lsn || bs[0].Commit.IsZero() {
		t.Fatalf("recorded positions %+v, %v: want the last 3 batches, newest first, with commit times, at or before %s", bs, err, last.lsn)
	}
	if a := bound(fmt.Sprintf("batch:%d", bs[1].Batch)); a.Bound.Seq != bs[1].Seq {
		t.Errorf("asof batch:%d is as of %s, want %s", bs[1].Batch, a.Bound.Seq, bs[1].Seq)
	}
	// The newest batch ends past its last event (its commit's end): as a
	// batch and as an LSN, a position the lake records, not one after it.
	for _, pos := range []string{fmt.Sprintf("batch:%d", bs[0].Batch), bs[0].Seq.String()} {
		if a := bound(pos); a.After || a.Bound.Seq != bs[0].Seq {
			t.Errorf("asof %s (the newest batch) is as of %s, after the lake's last event: %v; want %s, not after", pos, a.Bound.Seq, a.After, bs[0].Seq)
		}
	}
	// --table: a mart by its bare name and a history table are known; a
	// name that is no table is refused before the lake is replayed,
	// naming the tables there are.
	for _, tb := range []string{"daily_revenue", "silver.customers_history"} {
		a, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: last.lsn.String(), Table: tb}, h.log)
		if err != nil {
			t.Fatalf("asof --table %s: %v", tb, err)
		}
		a.Close()
	}
	if _, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: last.lsn.String(), Table: "nope"}, h.log); !errors.Is(err, fault.ErrQuery) ||
		!strings.Contains(err.Error(), "--table nope is no table") || !strings.Contains(err.Error(), "gold.daily_revenue") {
		t.Errorf("asof --table nope: %v, want a query error naming the tables", err)
	}
	if _, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: last.lsn.String(), Table: "paymnts"}, h.log); !errors.Is(err, fault.ErrQuery) ||
		!strings.Contains(err.Error(), "--table paymnts is no table of the warehouse as of a position (did you mean payments?)") {
		t.Errorf("asof --table paymnts: %v, want a query error that suggests payments", err)
	}
	// After the last event: said, and the latest state.
	if a := bound((last.lsn + 1<<30).String()); !a.After {
		t.Error("a position after the lake's last event is not said to be")
	}
	// Before the first event, a malformed one, a record not in the lake.
	for pos, want := range map[string]string{
		"0/10":                 "before the lake's first event",
		"1970-01-02":           "before the lake's first event",
		"yesterday":            "a Kafka record (<topic>:<partition>:<offset>)",
		"batch:999999":         "no lake file names batch 999999",
		topic + ":7:1":         "is not in the lake",
		"no.such.topic:0:1":    "holds no table of the lake",
		"2024-13-45T99:00:00Z": "is not one lakeflow reads",
	} {
		_, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: pos, Table: "payments"}, h.log)
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, fault.ErrQuery) {
			t.Errorf("asof %s: %v, want a query error saying %q", pos, err, want)
		}
	}
}

// TestAsOfBesideARunningPipeline: lakeflow asof reads the lake while
// lakeflow run --follow writes it, and neither waits for nor disturbs
// the other (asof leaves the run's staged files alone); the scheduled
// data checks do the same and land in lakeflow.checks.
func TestAsOfBesideARunningPipeline(t *testing.T) {
	h := newHarness(t, qualified(demoTables)...)
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	// The data checks run on a schedule beside the pipeline too.
	h.cfg.Check.Interval = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, h.cfg, Options{Follow: true, Workload: func(ctx context.Context, dsn string) error {
			_, err := demo.Workload{Events: 30000, Seed: 41, Clean: true}.Run(ctx, dsn)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}}, h.log)
	}()
	built := 0
	for deadline := time.Now().Add(time.Minute); built < 5 && time.Now().Before(deadline); {
		a, err := BuildAsOf(context.Background(), h.cfg, AsOfOptions{Position: "0/FFFFFFFF", Table: "orders"}, h.log)
		if err != nil {
			if strings.Contains(err.Error(), "no events yet") || strings.Contains(err.Error(), "no lake at") {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			cancel()
			t.Fatalf("asof beside a running pipeline: %v", err)
		}
		a.Close()
		built++
	}
	time.Sleep(time.Second) // a scheduled check or more, recorded
	cancel()
	if err := waitStopped(t, done); err != nil {
		t.Fatalf("the run beside asof: %v", err)
	}
	if built < 5 {
		t.Fatalf("asof answered %d times while the pipeline ran, want 5", built)
	}
	db := openDuck(t, h.cfg.Warehouse.Path)
	defer db.Close()
	var runs int
	queryRow(t, db, "SELECT count(DISTINCT checked_at) FROM lakeflow.checks WHERE part = 'data' AND \"check\" = 'passed'", &runs)
	if runs == 0 {
		t.Error("no scheduled check was recorded in lakeflow.checks")
	}
}

func TestParsePosition(t *testing.T) {
	for in, want := range map[string]position{
		"0/1A2B3C4":                  {seq: 0x1A2B3C4, isSeq: true},
		"16/0":                       {seq: 0x16_0000_0000, isSeq: true},
		"27439044":                   {seq: 27439044, isSeq: true},
		"batch:42":                   {batch: 42},
		"lakeflow.public.orders:3:7": {kafka: &kafkaRecord{topic: "lakeflow.public.orders", partition: 3, offset: 7}},
		"2024-07-01T09:00:00+02:00":  {time: time.Date(2024, 7, 1, 7, 0, 0, 0, time.UTC)},
		"2024-07-01T09:00:00.5Z":     {time: time.Date(2024, 7, 1, 9, 0, 0, 5e8, time.UTC)},
		"2024-07-01":                 {time: time.Date(2024, 7, 1, 0, 0, 0, 0, time.UTC)},
	} {
		got, err := parsePosition(in)
		if err != nil || got.seq != want.seq || got.isSeq != want.isSeq || got.batch != want.batch || !got.time.Equal(want.time) ||
			(got.kafka == nil) != (want.kafka == nil) || (got.kafka != nil && *got.kafka != *want.kafka) {
			t.Errorf("parsePosition(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "batch:0", "0/1G", "99999999999999999999999", "orders:x:1", "2024-02-30", "tomorrow"} {
		if _, err := parsePosition(in); err == nil || !errors.Is(err, fault.ErrQuery) || !strings.Contains(err.Error(), "a recorded batch (batch:42") {
			t.Errorf("parsePosition(%q): %v, want an error listing the accepted forms", in, err)
		}
	}
}

// FuzzParsePosition: any text is a position of exactly one form or an
// error that lists the forms, and a position written back in its form
// parses to itself.
func FuzzParsePosition(f *testing.F) {
	for _, s := range []string{"0/1A2B3C4", "27439044", "batch:42", "lf.public.orders:3:7", "2024-07-01T09:00:00+02:00",
		"2024-07-01", "2024-07-01 09:00", " 16/0 ", "batch:-1", "a:99999999999:1", "18446744073709551616"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parsePosition(s)
		if err != nil {
			if !errors.Is(err, fault.ErrQuery) || !strings.Contains(err.Error(), PositionForms) {
				t.Fatalf("parsePosition(%q): %v, want a query error listing the forms", s, err)
			}
			return
		}
		var again string
		forms := 0
		if p.isSeq {
			forms++
			again = strconv.FormatUint(uint64(p.seq), 10)
		}
		if p.batch != 0 {
			forms++
			again = fmt.Sprintf("batch:%d", p.batch)
		}
		if p.kafka != nil {
			forms++
			again = fmt.Sprintf("%s:%d:%d", p.kafka.topic, p.kafka.partition, p.kafka.offset)
		}
		if !p.time.IsZero() {
			forms++
			again = p.time.Format(time.RFC3339Nano)
			if y := p.time.Year(); y < 1 || y > 9999 {
				return // RFC 3339 has no other years to write it back in
			}
		}
		if forms != 1 || p.batch < 0 || (p.kafka != nil && (p.kafka.partition < 0 || p.kafka.offset < 0)) {
			t.Fatalf("parsePosition(%q) = %+v: not one position", s, p)
		}
		q, err := parsePosition(again)
		if err != nil || q.seq != p.seq || q.batch != p.batch || !q.time.Equal(p.time) || (q.kafka == nil) != (p.kafka == nil) ||
			(q.kafka != nil && *q.kafka != *p.kafka) {
			t.Fatalf("parsePosition(%q) = %+v, written back as %q parses to %+v, %v", s, p, again, q, err)
		}
	})
}

// asofAtEnd builds lakeflow asof's warehouse as of the lake's end, and
// returns it with its path.
func asofAtEnd(t *testing.T, h *harness) (*AsOf, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "asof.duckdb")
	a, err := BuildAsOf(context.Background(), h.cfg, AsOfOptions{Position: "FFFFFFFF/0", Out: out}, h.log)
	if err != nil {
		t.Fatalf("asof: %v", err)
	}
	a.Close()
	return a, out
}

// assertAsOfEqualsSource checks the warehouse lakeflow asof builds from
// the lake as of its end equals the source, table by table.
func assertAsOfEqualsSource(t *testing.T, h *harness, tables ...string) string {
	t.Helper()
	_, out := asofAtEnd(t, h)
	assertSilverEqualsSource(t, h.dsn, out, tables...)
	return out
}

// TestAsOfAcrossKafkaResets: a lake written from two Kafka logs (the
// first lost) holds two events at many offsets; asof, rules and
// quarantine included, still gives the stream's warehouse.
func TestAsOfAcrossKafkaResets(t *testing.T) {
	h := newDemoHarness(t)
	useDemoContracts(t, h)
	ctx := context.Background()
	workload := func(seed uint64) Options { return demoWorkload(demo.Workload{Events: 2000, Seed: seed}) }
	h.run(t, workload(51))
	if err := os.RemoveAll(h.cfg.Kafka.Dir); err != nil {
		t.Fatal(err)
	}
	h.run(t, workload(52))
	out := filepath.Join(h.dir, "asof.duckdb")
	a, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: "FFFFFFFF/0", Out: out}, h.log)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	db := attachBoth(t, h.cfg.Warehouse.Path, out)
	defer db.Close()
	for _, table := range []string{"silver.customers", "silver.products", "silver.orders", "silver.order_items", "silver.payments", "silver.customers_history"} {
		assertSameRows(t, db, table, "*")
	}
	assertSameRows(t, db, "lakeflow.quarantine", "* EXCLUDE (quarantined_at)")
}
