package pipeline

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// goldWorkload drives the demo shop over several runs: the demo's clean
// mix (a quarter of its orders booked up to two weeks back), then
// changes that move old days: backdated orders, orders moved in and out
// of revenue, an order deleted and inserted again, products moved to
// another category, rows that break rules (one fixed later), a customer
// deleted and inserted again; with a state checkpoint after the first.
func goldWorkload(t *testing.T, h *harness) {
	t.Helper()
	useDemoContracts(t, h)
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	mix := func(seed uint64) func(ctx context.Context, dsn string) error {
		return func(ctx context.Context, dsn string) error {
			_, err := demo.Workload{Events: 2500, Seed: seed, Clean: true}.Run(ctx, dsn)
			return err
		}
	}
	h.run(t, Options{Workload: mix(11)})
	// A backfill of days starts from it, and replays the rest.
	writeCheckpoint(t, h)
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency, created_at)
				SELECT 900000 + g, 1 + g % 20, 'paid', 1000 * g, 'EUR', now() - make_interval(days => 9 + g % 3) FROM generate_series(1, 30) g`,
				`INSERT INTO order_items SELECT 900000 + g, 1, 1 + g % 10, 1 + g % 4, 250 FROM generate_series(1, 30) g`},
			{`UPDATE orders SET status = 'cancelled' WHERE id IN (SELECT id FROM orders WHERE status = 'paid' AND created_at < now() - INTERVAL '3 days' ORDER BY id LIMIT 5)`},
			{`UPDATE orders SET status = 'paid' WHERE id IN (SELECT id FROM orders WHERE status = 'pending' AND created_at < now() - INTERVAL '3 days' ORDER BY id LIMIT 5)`},
			{`UPDATE orders SET created_at = created_at - INTERVAL '4 days' WHERE id IN (SELECT id FROM orders WHERE status = 'delivered' ORDER BY id LIMIT 3)`},
			{`DELETE FROM order_items WHERE order_id = 900001`, `DELETE FROM orders WHERE id = 900001`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency, created_at) VALUES (900001, 2, 'shipped', 4242, 'EUR', now() - INTERVAL '12 days')`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency, created_at) VALUES (900100, 1, 'paid', -5, 'EUR', now() - INTERVAL '8 days')`},
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES (900101, 999999, 'paid', 500, 'EUR')`},
			{`UPDATE orders SET status = 'lost' WHERE id = 900002`},
			{`UPDATE orders SET status = 'delivered' WHERE id = 900002`},
			{`INSERT INTO customers (id, email, name, country, segment) VALUES (900200, 'new@example.com', 'New', 'FR', 'consumer')`},
			{`DELETE FROM customers WHERE id = 900200`},
			{`INSERT INTO customers (id, email, name, country, segment) VALUES (900200, 'again@example.com', 'Again', 'DE', 'smb')`},
			{`UPDATE customers SET email = 'broken' WHERE id = 3`},
			{`UPDATE customers SET email = 'fixed@example.com' WHERE id = 3`},
		})
	}})
	h.run(t, Options{Workload: mix(12)})
	// Last, alone: only the products' touch refreshes the days they sold,
	// and only an order's new image its new day.
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`UPDATE products SET category = CASE category WHEN 'toys' THEN 'books' ELSE 'toys' END WHERE id IN (1, 2, 3)`},
			{`UPDATE orders SET created_at = created_at - INTERVAL '30 days' WHERE id = (SELECT min(id) FROM orders WHERE status = 'paid')`}})
	}})
}

// TestStreamBackfillAndSourceAgree is invariant 5: a multi-day workload
// streamed in four runs, and the same lake rebuilt with lakeflow
// backfill --all into a second file, give identical silver, history,
// quarantine and gold, row for row; and the gold marts equal the same
// definitions computed in PostgreSQL from the source.
func TestStreamBackfillAndSourceAgree(t *testing.T) {
	h := newHarness(t, qualified(demoTables)...)
	goldWorkload(t, h)
	rebuilt := filepath.Join(h.dir, "rebuilt.duckdb")
	st, err := Backfill(context.Background(), h.cfg, BackfillOptions{All: true, Out: rebuilt}, h.log)
	if err != nil {
		t.Fatal(err)
	}
	if st.Events == 0 {
		t.Fatal("the backfill replayed nothing")
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "products", "order_items", "payments")
	db := attachBoth(t, h.cfg.Warehouse.Path, rebuilt)
	defer db.Close()
	var days int
	queryRow(t, db, "SELECT count(*) FROM a.gold.daily_revenue", &days)
	if days < 7 {
		t.Fatalf("the workload spans %d order days, want at least 7", days)
	}
	for _, table := range []string{"silver.customers", "silver.products", "silver.orders", "silver.order_items", "silver.payments",
		"silver.customers_history", "gold.daily_revenue", "gold.product_ranks", "gold.customer_ltv"} {
		assertSameRows(t, db, table, "*")
	}
	assertSameRows(t, db, "lakeflow.quarantine", "* EXCLUDE (quarantined_at)")
	var quarantined int
	queryRow(t, db, "SELECT count(*) FROM a.lakeflow.quarantine", &quarantined)
	if quarantined < 3 {
		t.Fatalf("the workload quarantined %d changes, want at least 3", quarantined)
	}
	assertGoldEqualsSource(t, db, h.dsn)
	assertHistoryEqualsLake(t, db, h.cfg.Lake.Dir)

	// backfill --from --to, from an order day to today (the workload's
	// commit day), restores what was damaged in those days, and --mart
	// changes nothing more: the same tables, row for row.
	var from time.Time
	queryRow(t, db, "SELECT min(order_date)::TIMESTAMP + INTERVAL 1 DAY FROM a.gold.daily_revenue", &from)
	db.Close()
	to := time.Now().UTC().Truncate(24 * time.Hour)
	live, err := sql.Open("duckdb", h.cfg.Warehouse.Live)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		"DELETE FROM gold.daily_revenue WHERE order_date >= ?",
		"UPDATE gold.product_ranks SET units = units + 1 WHERE order_date >= ?",
		"UPDATE silver.orders SET total_cents = total_cents + 1 WHERE id IN (SELECT id FROM silver.orders WHERE created_at >= ? LIMIT 5)",
		"UPDATE gold.customer_ltv SET orders = orders + 1 WHERE last_order_date >= ?",
	} {
		if _, err := live.Exec(stmt, from); err != nil {
			t.Fatal(err)
		}
	}
	live.Close()
	// Days the lake holds no change of: said, and the lake not replayed.
	ancient, logged := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC), len(h.logs.String())
	_, err = Backfill(context.Background(), h.cfg, BackfillOptions{From: ancient, To: ancient.AddDate(0, 0, 1)}, h.log)
	if said := h.logs.String()[logged:]; err != nil || !strings.Contains(said, "the lake holds no change committed on those days") || strings.Contains(said, "lake replayed") {
		t.Fatalf("backfill of days the lake lacks: %v\n%s", err, said)
	}
	for _, opts := range []BackfillOptions{{From: from, To: to}, {From: from, To: to, Mart: "product_ranks"}} {
		st, err := Backfill(context.Background(), h.cfg, opts, h.log)
		if err != nil {
			t.Fatalf("backfill %+v: %v", opts, err)
		}
		if opts.Mart == "" && (st.From == 0 || st.Events == 0) {
			t.Errorf("the backfill of days started from the checkpoint at %d and replayed %d events after it: want the one after the first run, and the runs since", uint64(st.From), st.Events)
		}
	}
	db = attachBoth(t, h.cfg.Warehouse.Path, rebuilt)
	for _, table := range []string{"silver.customers", "silver.orders", "silver.order_items", "silver.customers_history",
		"gold.daily_revenue", "gold.product_ranks", "gold.customer_ltv"} {
		assertSameRows(t, db, table, "*")
	}
	assertSameRows(t, db, "lakeflow.quarantine", "* EXCLUDE (quarantined_at)")
}

// assertHistoryEqualsLake checks silver.customers_history against the
// versions read from the lake directly: per key, the last change of each
// transaction that was not held back; each change but a delete opens a
// version, which the key's next change closes.
func assertHistoryEqualsLake(t *testing.T, db *sql.DB, lakeDir string) {
	t.Helper()
	lake := fmt.Sprintf(`SELECT * FROM (WITH held AS (SELECT key->>'id' AS id, _cdc_seq, _cdc_ord FROM a.lakeflow.quarantine
			WHERE source_table = 'public.customers' AND action = 'quarantine'),
		events AS (SELECT COALESCE(after, before) AS img, op, _cdc_seq, _cdc_ord, _commit_ts
			FROM read_parquet('%s/customers/*/*.parquet', union_by_name = true) e
			WHERE op <> 't' AND NOT EXISTS (SELECT 1 FROM held h WHERE h.id = COALESCE(after, before).id::VARCHAR AND h._cdc_seq = e._cdc_seq AND h._cdc_ord = e._cdc_ord)
			QUALIFY row_number() OVER (PARTITION BY COALESCE(after, before).id, _cdc_seq ORDER BY _cdc_ord DESC) = 1),
		versions AS (SELECT img, op, _commit_ts, lead(_commit_ts) OVER (PARTITION BY img.id ORDER BY _cdc_seq, _cdc_ord) AS until FROM events)
		SELECT img.id, img.email, img.name, img.segment, _commit_ts, until, until IS NULL FROM versions WHERE op <> 'd')`, lakeDir)
	hist := `SELECT id, email, name, segment, valid_from, valid_to, is_current FROM a.silver.customers_history`
	var diff, n int64
	queryRow(t, db, fmt.Sprintf("SELECT count(*) FROM ((%s EXCEPT ALL %s) UNION ALL (%s EXCEPT ALL %s))", lake, hist, hist, lake), &diff)
	queryRow(t, db, "SELECT count(*) FROM ("+hist+") WHERE NOT is_current", &n)
	if diff != 0 || n == 0 {
		var sample string
		queryRow(t, db, fmt.Sprintf(`SELECT coalesce(string_agg(x::VARCHAR, chr(10)), '') FROM (SELECT 'lake' AS side, * FROM (%s EXCEPT ALL %s)
			UNION ALL SELECT 'history', * FROM (%s EXCEPT ALL %s) ORDER BY ALL LIMIT 8) x`, lake, hist, hist, lake), &sample)
		t.Errorf("silver.customers_history: %d rows differ from the lake's versions (%d closed versions):\n%s", diff, n, sample)
	}
}

// attachBoth opens DuckDB with warehouses a and b attached read-only.
func attachBoth(t *testing.T, a, b string) *sql.DB {
	t.Helper()
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	for _, stmt := range []string{"SET TimeZone = 'UTC'", "ATTACH '" + a + "' AS a (READ_ONLY)", "ATTACH '" + b + "' AS b (READ_ONLY)"} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// assertSameRows checks a table holds the same rows in a and b.
func assertSameRows(t *testing.T, db *sql.DB, table, cols string) {
	t.Helper()
	a, b := "SELECT "+cols+" FROM a."+table, "SELECT "+cols+" FROM b."+table
	var diff, n int64
	queryRow(t, db, fmt.Sprintf("SELECT count(*) FROM ((%s EXCEPT ALL %s) UNION ALL (%s EXCEPT ALL %s))", a, b, b, a), &diff)
	queryRow(t, db, "SELECT count(*) FROM a."+table, &n)
	if diff != 0 || n == 0 {
		var sample string
		queryRow(t, db, fmt.Sprintf(`SELECT coalesce(string_agg(x::VARCHAR, chr(10)), '') FROM (SELECT 'only in a' AS side, * FROM (%s EXCEPT ALL %s)
			UNION ALL SELECT 'only in b', * FROM (%s EXCEPT ALL %s) ORDER BY ALL LIMIT 8) x`, a, b, b, a), &sample)
		t.Errorf("%s: %d rows differ between warehouses a and b (%d rows in a):\n%s", table, diff, n, sample)
	}
}

// goldInPostgres are the demo's marts computed in PostgreSQL from the
// source, with the same definitions, over the rows that pass the demo's
// contract rules (the workload's rule breaches are rows that never pass,
// or are fixed).
var goldInPostgres = map[string]string{
	"daily_revenue": `
		SELECT (o.created_at AT TIME ZONE 'UTC')::date AS order_date, count(*), count(*) FILTER (WHERE o.status IN ('paid', 'shipped', 'delivered')),
			count(*) FILTER (WHERE o.status = 'cancelled'), count(DISTINCT o.customer_id),
			coalesce(sum(o.total_cents) FILTER (WHERE o.status IN ('paid', 'shipped', 'delivered')), 0),
			round(avg(o.total_cents) FILTER (WHERE o.status IN ('paid', 'shipped', 'delivered')))::bigint,
			round((percentile_cont(0.99) WITHIN GROUP (ORDER BY o.total_cents) FILTER (WHERE o.status IN ('paid', 'shipped', 'delivered')))::numeric, 4)
		FROM valid_orders o GROUP BY 1`,
	"product_ranks": `
		SELECT order_date, category, product_id, units, revenue_cents,
			rank() OVER (PARTITION BY order_date, category ORDER BY revenue_cents DESC)
		FROM (SELECT (o.created_at AT TIME ZONE 'UTC')::date AS order_date, p.category, p.id AS product_id,
				sum(i.quantity) AS units, sum(i.quantity * i.unit_price_cents) AS revenue_cents
			FROM valid_orders o JOIN order_items i ON i.order_id = o.id AND i.quantity > 0 JOIN products p ON p.id = i.product_id
			WHERE o.status IN ('paid', 'shipped', 'delivered') GROUP BY 1, 2, 3) x`,
	"customer_ltv": `
		SELECT c.id, min(o.created_at AT TIME ZONE 'UTC')::date, max(o.created_at AT TIME ZONE 'UTC')::date, count(*),
			sum(o.total_cents), round(avg(o.total_cents))::bigint
		FROM valid_customers c JOIN valid_orders o ON o.customer_id = c.id AND o.status IN ('paid', 'shipped', 'delivered')
		GROUP BY c.id`,
}

var goldInDuckDB = map[string]string{
	"daily_revenue": `SELECT order_date, orders, paid_orders, cancelled_orders, unique_customers, revenue_cents, avg_order_cents,
		round(p99_order_cents::DECIMAL(38, 10), 4) FROM a.gold.daily_revenue`,
	"product_ranks": `SELECT * FROM a.gold.product_ranks`,
	"customer_ltv":  `SELECT * FROM a.gold.customer_ltv`,
}

// assertGoldEqualsSource compares each mart with its definition run in
// PostgreSQL, row for row, as text.
func assertGoldEqualsSource(t *testing.T, db *sql.DB, dsn string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	prelude := `WITH valid_customers AS (SELECT * FROM customers WHERE email ~ '^[^@\s]+@[^@\s]+\.[^@\s]+$'),
		valid_orders AS (SELECT * FROM orders o WHERE o.total_cents >= 0
			AND o.status IN ('pending', 'paid', 'shipped', 'delivered', 'cancelled', 'refunded')
			AND EXISTS (SELECT 1 FROM valid_customers c WHERE c.id = o.customer_id)) `
	for mart, q := range goldInPostgres {
		rows, err := conn.Query(ctx, fmt.Sprintf("SELECT x::text FROM (%s%s) x ORDER BY 1", prelude, q))
		if err != nil {
			t.Fatalf("%s in PostgreSQL: %v", mart, err)
		}
		want, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		rows2, err := db.Query("DESCRIBE " + goldInDuckDB[mart])
		if err != nil {
			t.Fatal(err)
		}
		var cols []string
		for rows2.Next() {
			var name, typ string
			var n1, n2, n3, n4 sql.NullString
			if err := rows2.Scan(&name, &typ, &n1, &n2, &n3, &n4); err != nil {
				t.Fatal(err)
			}
			cols = append(cols, fmt.Sprintf(`coalesce(CAST("%s" AS VARCHAR), '')`, name))
		}
		rows2.Close()
		var got string
		queryRow(t, db, fmt.Sprintf(`SELECT string_agg(x, chr(10) ORDER BY x) FROM (SELECT '(' || concat_ws(',', %s) || ')' AS x FROM (%s))`,
			strings.Join(cols, ", "), goldInDuckDB[mart]), &got)
		if w := strings.Join(want, "\n"); got != strings.ReplaceAll(w, `"`, "") {
			t.Errorf("gold.%s differs from PostgreSQL's:\n%s", mart, firstDifference(strings.Split(strings.ReplaceAll(w, `"`, ""), "\n"), strings.Split(got, "\n")))
		}
	}
}

func firstDifference(want, got []string) string {
	for i := range max(len(want), len(got)) {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			return fmt.Sprintf("row %d (of %d in PostgreSQL, %d in gold): PostgreSQL %s, gold %s", i, len(want), len(got), w, g)
		}
	}
	return "same rows"
}
