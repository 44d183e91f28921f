package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// useDemoContracts copies the contracts the project ships into the
// harness's contracts.dir.
func useDemoContracts(t *testing.T, h *harness) {
	copyFiles(t, "../contracts/*.toml", h.cfg.Contracts.Dir, 5)
}

// copyFiles copies the files glob matches (at least n) into dir.
func copyFiles(t *testing.T, glob, dir string, n int) {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) < n {
		t.Fatalf("%s: %v %v", glob, files, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// breaches are changes of known rule breaches, one transaction each, and
// the quarantine they must leave: table, key and the rules, sorted.
var breaches = []struct {
	sql  []string
	want []string
}{
	{[]string{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (9001, 1, 'pending', -500, 'EUR')`},
		[]string{`public.orders {"id":9001} orders.total_non_negative`}},
	{[]string{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (9002, 1, 'lost', 100, 'EUR')`},
		[]string{`public.orders {"id":9002} orders.status_in_domain`}},
	{[]string{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (9003, 777777, 'pending', 100, 'EUR')`},
		[]string{`public.orders {"id":9003} orders.customer_exists`}},
	{[]string{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (9004, 1, 'pending', 100, 'EUR')`,
		`INSERT INTO order_items VALUES (9004, 1, 1, 0, 100)`},
		[]string{`public.order_items {"order_id":9004,"line_no":1} order_items.quantity_positive`}},
	{[]string{`INSERT INTO payments (id, order_id, amount_cents, method, status) VALUES (9005, 9004, -1, 'card', 'captured')`},
		[]string{`public.payments {"id":9005} payments.amount_positive`}},
	{[]string{`INSERT INTO customers (id, email, name, country, segment) VALUES (9006, 'nobody.example.com', 'N', 'FR', 'retail')`},
		[]string{`public.customers {"id":9006} customers.email_format`}},
	// Two rules at once.
	{[]string{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (9007, 1, 'bogus', -7, 'EUR')`},
		[]string{`public.orders {"id":9007} orders.status_in_domain,orders.total_non_negative`}},
	// A bad row fixed by a later update: silver gets the fixed one.
	{[]string{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (9008, 2, 'pending', -1, 'EUR')`},
		[]string{`public.orders {"id":9008} orders.total_non_negative`}},
	{[]string{`UPDATE orders SET total_cents = 800 WHERE id = 9008`}, nil},
	// A bad row deleted: the delete applies.
	{[]string{`INSERT INTO customers (id, email, name, country, segment) VALUES (9009, 'bad', 'B', 'DE', 'retail')`},
		[]string{`public.customers {"id":9009} customers.email_format`}},
	{[]string{`DELETE FROM customers WHERE id = 9009`}, nil},
	// A customer and its first order in one transaction pass; an order of
	// a customer deleted before it does not.
	{[]string{`INSERT INTO customers (id, email, name, country, segment) VALUES (9010, 'new@example.com', 'New', 'IT', 'retail')`,
		`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (9010, 9010, 'pending', 100, 'EUR')`}, nil},
	{[]string{`DELETE FROM customers WHERE id = 3`}, nil},
	{[]string{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (9011, 3, 'pending', 100, 'EUR')`},
		[]string{`public.orders {"id":9011} orders.customer_exists`}},
}

// TestContractsQuarantineExactlyTheBreaches: a workload with known
// breaches of each required rule leaves exactly those changes in
// lakeflow.quarantine, with exactly the right rule names; no live silver
// row breaks a rule; every other row equals the source.
func TestContractsQuarantineExactlyTheBreaches(t *testing.T) {
	h := newHarness(t, qualified(demoTables)...)
	useDemoContracts(t, h)
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	var steps [][]string
	var want []string
	for _, b := range breaches {
		steps = append(steps, b.sql)
		want = append(want, b.want...)
	}
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error { return applySteps(ctx, dsn, steps) }})
	slices.Sort(want)
	if got := quarantined(t, h); !slices.Equal(got, want) {
		t.Fatalf("lakeflow.quarantine:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	db := openDuck(t, h.cfg.Warehouse.Path)
	var breaking int
	queryRow(t, db, `SELECT (SELECT count(*) FROM silver.orders WHERE NOT _deleted AND (total_cents < 0 OR status NOT IN ('pending', 'paid', 'shipped', 'delivered', 'cancelled', 'refunded')
			OR customer_id NOT IN (SELECT id FROM silver.customers)))
		+ (SELECT count(*) FROM silver.order_items WHERE NOT _deleted AND quantity <= 0)
		+ (SELECT count(*) FROM silver.payments WHERE NOT _deleted AND amount_cents <= 0)
		+ (SELECT count(*) FROM silver.customers WHERE NOT _deleted AND NOT regexp_full_match(email, '[^@\s]+@[^@\s]+\.[^@\s]+'))`, &breaking)
	db.Close()
	if breaking != 0 {
		t.Fatalf("%d live silver rows break a rule", breaking)
	}
	// The rows the source holds that break no rule are in silver as they
	// are; the fixed order among them.
	pgtest.Exec(t, h.dsn, `DELETE FROM orders WHERE id IN (9001, 9002, 9003, 9007, 9011)`, `DELETE FROM order_items WHERE order_id = 9004`,
		`DELETE FROM payments WHERE id = 9005`, `DELETE FROM customers WHERE id = 9006`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)

}

// quarantined lists lakeflow.quarantine as "table key rules" lines.
func quarantined(t *testing.T, h *harness) []string {
	t.Helper()
	db := openDuck(t, h.cfg.Warehouse.Path)
	defer db.Close()
	rows, err := db.Query(`SELECT source_table || ' ' || key::VARCHAR || ' ' || array_to_string(list_sort(rules), ',') FROM lakeflow.quarantine ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// TestContractsInitWritesValidContracts: contracts init writes, from the
// live source, a contract each captured table without one can be run with
// (enums, domains, arrays and every type family included), and leaves the
// existing ones alone.
func TestContractsInitWritesValidContracts(t *testing.T) {
	h := newHarness(t, "public.typed", "public.scratch", "public.gen")
	pgtest.Exec(t, h.dsn, typedDDL, typedRow("1", 0),
		`CREATE TABLE gen (id int PRIMARY KEY, price int NOT NULL, total int GENERATED ALWAYS AS (price * 2) STORED)`, `ALTER TABLE gen REPLICA IDENTITY FULL`)
	ctx := context.Background()
	written, err := InitContracts(ctx, h.cfg, "public.scratch", h.log)
	if err != nil || len(written) != 1 {
		t.Fatalf("init --table public.scratch: %v %v", written, err)
	}
	if written, err = InitContracts(ctx, h.cfg, "", h.log); err != nil || len(written) != 2 {
		t.Fatalf("init: %v %v", written, err)
	}
	set, err := contracts.Load(h.cfg.Contracts.Dir)
	if err != nil {
		t.Fatal(err)
	}
	typed := set.For("public", "typed")
	if typed == nil || typed.Column("e").Base != "text" || typed.Column("dom").Base != "integer" || typed.Column("id").Nullable || !slices.Equal(typed.Key, []string{"id"}) {
		t.Fatalf("typed contract: %+v", typed)
	}
	if set.For("public", "gen").Column("total") != nil {
		t.Fatal("a stored generated column is in the contract, but lakeflow does not capture it")
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.typed", "public.gen")
}

// TestFailRuleStopsTheRunLosingNothing: a change that breaks a rule whose
// action is fail stops the run with an error naming the row and the
// rule, once its batch's records are staged (and released): nothing of
// that batch is applied, and nothing after it. With the rule relaxed,
// the next run reads the batch from Kafka again and silver is the source.
func TestFailRuleStopsTheRunLosingNothing(t *testing.T) {
	h := newHarness(t, qualified(demoTables)...)
	useDemoContracts(t, h)
	contract := filepath.Join(h.cfg.Contracts.Dir, "payments.toml")
	original, err := os.ReadFile(contract)
	if err != nil {
		t.Fatal(err)
	}
	failing := strings.Replace(string(original), `check = "amount_cents > 0"`, "check = \"amount_cents > 0\"\naction = \"fail\"", 1)
	if failing == string(original) {
		t.Fatal("payments.amount_positive not found in the demo's contract")
	}
	if err := os.WriteFile(contract, []byte(failing), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	pay := func(id, cents int) []string {
		return []string{fmt.Sprintf(`INSERT INTO payments (id, order_id, amount_cents, method, status) VALUES (%d, 1, %d, 'card', 'captured')`, id, cents)}
	}
	err = runWatched(t, h.cfg, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{pay(9101, 100), pay(9102, -5), pay(9103, 300)})
	}}, h.log)
	if !errors.Is(err, fault.ErrCheckFailed) || !strings.Contains(err.Error(), `public.payments row {"id":9102}`) || !strings.Contains(err.Error(), "payments.amount_positive") {
		t.Fatalf("want the failed rule and row named, got %v", err)
	}
	db := openDuck(t, h.cfg.Warehouse.Live)
	var applied int
	queryRow(t, db, `SELECT count(*) FROM silver.payments WHERE id IN (9102, 9103)`, &applied)
	db.Close()
	if applied != 0 {
		t.Fatalf("silver holds %d of the failed change and the one after it", applied)
	}
	if err := os.WriteFile(contract, original, 0o644); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, h.dsn, `DELETE FROM payments WHERE id = 9102`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
}

// writeContracts writes contract files (name: body) into h's contracts
// directory.
func writeContracts(t *testing.T, h *harness, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
