package pipeline

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// orphans lists the live silver orders whose customer is not live, and
// the live items whose order is not.
func orphans(t *testing.T, h *harness) string {
	t.Helper()
	db := openDuck(t, h.cfg.Warehouse.Path)
	defer db.Close()
	var s string
	queryRow(t, db, `SELECT coalesce(string_agg(x, ', ' ORDER BY x), '') FROM (
		SELECT 'order ' || o.id AS x FROM silver.orders o
		WHERE NOT o._deleted AND NOT EXISTS (SELECT 1 FROM silver.customers c WHERE c.id = o.customer_id AND NOT c._deleted)
		UNION ALL
		SELECT 'item ' || i.order_id || '/' || i.line_no FROM silver.order_items i
		WHERE NOT i._deleted AND NOT EXISTS (SELECT 1 FROM silver.orders o WHERE o.id = i.order_id AND NOT o._deleted))`, &s)
	return s
}

// TestReferencesAsOfCommit: orders.customer_exists judges the customer as
// the order's transaction commits (a deferred foreign key): an order
// written before its customer in one transaction passes; one whose
// customer the same transaction deletes, or truncates, fails; orders the
// initial snapshot takes find the snapshot's customers, and an order of a
// later run finds its customer in silver.
func TestReferencesAsOfCommit(t *testing.T) {
	h := newHarness(t, qualified(demoTables)...)
	useDemoContracts(t, h)
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, h.dsn, `INSERT INTO orders (id, customer_id, status, total_cents, currency)
		SELECT g, g, 'pending', 100, 'EUR' FROM generate_series(1, 5) g`)
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (8001, 8001, 'pending', 100, 'EUR')`,
				`INSERT INTO customers (id, email, name, country, segment) VALUES (8001, 'a@example.com', 'A', 'FR', 'consumer')`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (8002, 6, 'pending', 100, 'EUR')`,
				`DELETE FROM customers WHERE id = 6`},
			{`TRUNCATE customers CASCADE`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (8003, 7, 'pending', 100, 'EUR')`},
			{`INSERT INTO customers (id, email, name, country, segment) VALUES (9001, 'b@example.com', 'B', 'FR', 'consumer')`},
		})
	}})
	// A customer an earlier run applied is in silver alone.
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (8004, 9001, 'pending', 100, 'EUR')`}})
	}})
	got := strings.Join(quarantined(t, h), "\n")
	for _, want := range []string{`public.orders {"id":8002} orders.customer_exists`, `public.orders {"id":8003} orders.customer_exists`} {
		if !strings.Contains(got, want) {
			t.Errorf("quarantine lacks %s:\n%s", want, got)
		}
	}
	if strings.Count(got, "customer_exists") != 2 {
		t.Errorf("want exactly orders 8002 and 8003 quarantined for customer_exists:\n%s", got)
	}
}

// TestReferenceChainsHoldBack: an item whose order is held back in the
// same batch is held back too (order_items → orders → customers), after
// a restart as in the first run.
func TestReferenceChainsHoldBack(t *testing.T) {
	h := newHarness(t, qualified(demoTables)...)
	useDemoContracts(t, h)
	p := filepath.Join(h.cfg.Contracts.Dir, "order_items.toml")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data = append(data, "\n[[rules]]\nname = \"order_known\"\nreferences = \"public.orders\"\non = { order_id = \"id\" }\n"...)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{{
			`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (7001, 777777, 'pending', 100, 'EUR')`,
			`INSERT INTO order_items VALUES (7001, 1, 1, 1, 100)`}})
	}})
	if o := orphans(t, h); o != "" {
		t.Fatalf("live rows whose reference is held back: %s", o)
	}
	if got := strings.Join(quarantined(t, h), "\n"); !strings.Contains(got, "order_items.order_known") {
		t.Fatalf("the item is not quarantined:\n%s", got)
	}
}

// TestSplitTransactionsJudgeReferencesAtCommit: a snapshot larger than
// batch_bytes is applied in parts, and a part holds children whose
// parent is in a later part (the snapshot copies the child table first,
// and a lock holds the copy of the parent until a part has committed).
// Existence rules are judged as the transaction commits: nothing is
// quarantined, silver equals the source, and nothing stays deferred.
func TestSplitTransactionsJudgeReferencesAtCommit(t *testing.T) {
	h := newHarness(t, "public.c", "public.p")
	pgtest.Exec(t, h.dsn, `CREATE TABLE p (id int PRIMARY KEY, pad text)`, `CREATE TABLE c (id int PRIMARY KEY, pid int, pad text)`,
		`ALTER TABLE p REPLICA IDENTITY FULL`, `ALTER TABLE c REPLICA IDENTITY FULL`,
		`INSERT INTO c SELECT g, g, repeat('x', 200) FROM generate_series(1, 40000) g`,
		`INSERT INTO p SELECT g, repeat('y', 200) FROM generate_series(1, 40000) g`)
	writeContracts(t, h, map[string]string{
		"p.toml": "table = \"public.p\"\nkey = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integer\"\n[[columns]]\nname = \"pad\"\ntype = \"text\"\n",
		"c.toml": "table = \"public.c\"\nkey = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integer\"\n[[columns]]\nname = \"pid\"\ntype = \"integer\"\n" +
			"[[columns]]\nname = \"pad\"\ntype = \"text\"\n[[rules]]\nname = \"p_exists\"\nreferences = \"public.p\"\non = { pid = \"id\" }\n",
	})
	t.Setenv("LAKEFLOW_PIPELINE_BATCH_BYTES", "256KiB")
	ctx := context.Background()
	run := start(t, h, "run")
	for !strings.Contains(h.logs.String(), "initial snapshot started") {
		time.Sleep(2 * time.Millisecond) // the lock must come before the copy of p
	}
	tx, err := pgtest.Connect(t, h.dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE p IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a batch holding part of the snapshot", func() bool { return strings.Contains(h.logs.String(), "consistent=false") })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := run.wait(t); err != nil {
		t.Fatalf("lakeflow run: %v", err)
	}
	if got := quarantined(t, h); len(got) > 0 {
		t.Fatalf("quarantined %d changes, want none; the first: %s", len(got), got[0])
	}
	if n := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM lakeflow.deferred"); n != "0" {
		t.Fatalf("%s changes still deferred after the last batch", n)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "c", "p")
}
