package pipeline

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestParkedTableWhileOthersStream: under lakeflow run --follow, a column
// the contract of t lists is dropped. t is parked: a's changes (one
// transaction touches both) go on being applied, t's wait in the WAL
// (the slot is confirmed no further), status and check say so with the
// edit that releases it. The contract edit releases it without a
// restart: t's changes since the drop are read from the WAL again and
// applied, and silver, the lake and a rebuild from the lake equal the
// source.
func TestParkedTableWhileOthersStream(t *testing.T) {
	h := newHarness(t, "public.a", "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE a (id int PRIMARY KEY, v int)`, `INSERT INTO a SELECT g, g FROM generate_series(1, 50) g`,
		`CREATE TABLE t (id int PRIMARY KEY, v int, w text)`, `INSERT INTO t SELECT g, g, 'w' || g FROM generate_series(1, 50) g`)
	writeContract(t, h, "", "id", "integer", "v", "integer", "w", "text")
	h.run(t, Options{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, h.cfg, Options{Follow: true}, h.log) }()
	waitFor(t, "the pipeline running", func() bool { return strings.Contains(h.logs.String(), "streaming") })
	// The change of shape comes with a large insert: read again after the
	// release, it takes seconds, while the source is otherwise quiet.
	if err := applySteps(ctx, h.dsn, [][]string{
		{`ALTER TABLE t DROP COLUMN w`, `INSERT INTO t SELECT g, g FROM generate_series(1000, 120999) g`},
		{`INSERT INTO t VALUES (100, 100)`, `UPDATE t SET v = -v WHERE id <= 3`, `DELETE FROM t WHERE id = 50`},
		{`INSERT INTO a VALUES (100, 100)`, `UPDATE t SET v = 7 WHERE id = 4`},
	}); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, h.dsn, `UPDATE a SET v = -v WHERE id <= 10`, `INSERT INTO a VALUES (101, 101)`)
	published := func(query string) string {
		db, err := sql.Open("duckdb", h.cfg.Warehouse.Path+"?access_mode=READ_ONLY")
		if err != nil {
			return ""
		}
		defer db.Close()
		var s string
		db.QueryRow(query).Scan(&s)
		return s
	}
	waitFor(t, "a's changes after t's drop applied", func() bool { return published("SELECT count(*) FROM silver.a WHERE id = 101") == "1" })
	if got := published("SELECT count(*) FROM silver.t WHERE id = 100 OR _deleted"); got != "0" {
		t.Fatalf("silver.t holds %s of t's changes after the drop while t is parked", got)
	}
	if got := published("SELECT v FROM silver.a WHERE id = 100"); got != "100" {
		t.Fatalf("a's part of the transaction that also changed t: silver.a holds v = %q for id 100", got)
	}
	var parkedAt string
	waitFor(t, "status naming the parked table", func() bool {
		r, err := Status(ctx, h.cfg, slog.New(slog.DiscardHandler))
		if err != nil || len(r.Parked) != 1 {
			return false
		}
		p := r.Parked[0]
		parkedAt = p.At.Seq.String()
		return p.Table == "public.t" && strings.Contains(p.Reason, "column w was dropped") && strings.Contains(p.Fix, "edit the contract")
	})
	var confirmed, at string
	conn, err := pgx.Connect(ctx, h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, $2::pg_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, h.cfg.Source.Slot, parkedAt).Scan(&confirmed, &at); err != nil {
		t.Fatal(err)
	}
	var before bool
	if err := conn.QueryRow(ctx, `SELECT $1::pg_lsn < $2::pg_lsn`, confirmed, at).Scan(&before); err != nil || !before {
		t.Fatalf("the slot is confirmed to %s, not before the parked change at %s (%v)", confirmed, at, err)
	}
	report, err := Check(ctx, h.cfg, PartContracts, h.log)
	if err != nil {
		t.Fatal(err)
	}
	if !containsFinding(report, "source.parked_table", "public.t") {
		t.Fatalf("lakeflow check does not report the parked table: %+v", report.Findings)
	}

	// An edit whose rule silver cannot run (it takes v for text) releases
	// t all the same (it accepts the drop) and leaves the rules before in
	// force; the run goes on.
	writeContract(t, h, "[[rules]]\nname = \"bad\"\ncheck = \"length(v) > 0\"", "id", "integer", "v", "text")
	waitFor(t, "the bad rule refused", func() bool { return strings.Contains(h.logs.String(), "rules cannot run on silver") })
	writeContract(t, h, "", "id", "integer", "v", "integer")
	waitFor(t, "t released and its changes applied", func() bool {
		return published("SELECT count(*) FROM silver.t WHERE id = 100 OR id >= 1000 OR (id = 50 AND _deleted) OR (id = 4 AND v = 7)") == "120003"
	})
	pgtest.Exec(t, h.dsn, `INSERT INTO t VALUES (101, 101)`, `INSERT INTO a VALUES (102, 102)`)
	select {
	case err := <-errc:
		t.Fatalf("the run ended: %v", err)
	default:
	}
	cancel()
	if err := waitStopped(t, errc); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a", "public.t")
	assertLakeExactlyOnce(t, h.cfg, "public.a", "public.t")
	fromLake := backfillFromLakeAlone(t, h)
	assertSameSilver(t, h.cfg.Warehouse.Path, fromLake, "a")
	assertSameSilver(t, h.cfg.Warehouse.Path, fromLake, "t")
	ctx = context.Background()
	r, err := Status(ctx, h.cfg, slog.New(slog.DiscardHandler))
	if err != nil || slices.ContainsFunc(r.Parked, func(p change.ParkedTable) bool { return p.Released == 0 }) {
		t.Fatalf("status after the release: %v, parked %+v", err, r.Parked)
	}
	if err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn > $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, h.cfg.Source.Slot, at).Scan(&before); err != nil || !before {
		t.Fatalf("the slot stays before the change t was parked at once t's changes are applied (%v)", err)
	}
}

// containsFinding says whether r holds a finding of check for dataset.
func containsFinding(r *CheckReport, check, dataset string) bool {
	for _, f := range r.Findings {
		if f.Check == check && f.Dataset == dataset {
			return true
		}
	}
	return false
}

// TestParkedTableTakenOut: a run without --follow applies the other
// tables' changes, then exits 4 naming the parked table (dropped since:
// the way past is to take it out of source.tables); taken out, the table
// holds the slot no longer.
func TestParkedTableTakenOut(t *testing.T) {
	h := newHarness(t, "public.a", "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE a (id int PRIMARY KEY)`, `CREATE TABLE t (id int PRIMARY KEY, w text)`, `INSERT INTO t VALUES (1, 'w')`)
	writeContract(t, h, "", "id", "integer", "w", "text")
	h.run(t, Options{})
	// Dropped since, too: no contract edit brings it back.
	pgtest.Exec(t, h.dsn, `ALTER TABLE t DROP COLUMN w`, `INSERT INTO t VALUES (2)`, `INSERT INTO a VALUES (1)`, `DROP TABLE t`)
	err := runWatched(t, h.cfg, Options{}, h.log)
	if !errors.Is(err, fault.ErrSchemaBreak) || !strings.Contains(err.Error(), "column w was dropped") || !strings.Contains(err.Error(), "the other tables went on") ||
		!strings.Contains(err.Error(), "take public.t out of source.tables") {
		t.Fatalf("want the run to end naming the parked table and the way past, got %v", err)
	}
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM silver.a"); got != "1" {
		t.Fatalf("silver.a holds %s rows, want the one inserted while t is parked", got)
	}
	conn := pgtest.Connect(t, h.dsn)
	defer conn.Close(context.Background())
	lsn := func() string {
		var s string
		if err := conn.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, h.cfg.Source.Slot).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := lsn()
	removeTable(h, "public.t")
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `INSERT INTO a VALUES (2)`)
	h.run(t, Options{})
	var moved bool
	if err := conn.QueryRow(context.Background(), `SELECT $1::pg_lsn > $2::pg_lsn`, lsn(), before).Scan(&moved); err != nil || !moved {
		t.Fatalf("the slot stayed at %s after the parked table was taken out (%v)", before, err)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a")
}
