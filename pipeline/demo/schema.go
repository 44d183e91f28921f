// Package demo is the e-commerce demo: its source schema and a workload
// of customers, products, orders moving through their statuses, items
// and payments, with a small share of rows that break the contract rules
// (the source deliberately has no CHECK constraints for them).
package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// OrdersTable is the orders table of DDL as the source describes it, for
// benchmarks that need the demo's shape without a database.
func OrdersTable() *change.Table {
	return &change.Table{Schema: "public", Name: "orders", Columns: []change.Column{
		{Name: "id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}, Key: true},
		{Name: "customer_id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}},
		{Name: "status", Type: change.Type{Kind: change.KindText, Name: "text"}},
		{Name: "total_cents", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}},
		{Name: "currency", Type: change.Type{Kind: change.KindText, Name: "text"}},
		{Name: "created_at", Type: change.Type{Kind: change.KindTimestampTZ, Name: "timestamp with time zone"}},
		{Name: "updated_at", Type: change.Type{Kind: change.KindTimestampTZ, Name: "timestamp with time zone"}},
	}}
}

// DDL creates the demo tables (Setup then marks them).
const DDL = `
CREATE TABLE IF NOT EXISTS customers (
	id         bigint PRIMARY KEY,
	email      text NOT NULL,
	name       text NOT NULL,
	country    text NOT NULL,
	segment    text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now(),
	updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS products (
	id          bigint PRIMARY KEY,
	sku         text NOT NULL UNIQUE,
	name        text NOT NULL,
	category    text NOT NULL,
	price_cents bigint NOT NULL,
	active      boolean NOT NULL DEFAULT true
);
CREATE TABLE IF NOT EXISTS orders (
	id          bigint PRIMARY KEY,
	customer_id bigint NOT NULL,
	status      text NOT NULL,
	total_cents bigint NOT NULL,
	currency    text NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now(),
	updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS order_items (
	order_id         bigint NOT NULL,
	line_no          integer NOT NULL,
	product_id       bigint NOT NULL,
	quantity         integer NOT NULL,
	unit_price_cents bigint NOT NULL,
	PRIMARY KEY (order_id, line_no)
);
CREATE TABLE IF NOT EXISTS payments (
	id           bigint PRIMARY KEY,
	order_id     bigint NOT NULL,
	amount_cents bigint NOT NULL,
	method       text NOT NULL,
	status       text NOT NULL,
	created_at   timestamptz NOT NULL DEFAULT now()
);
`

// tables are DDL's tables; Setup has each bear the comment mark, by which
// CheckSource knows them. Their replica identity is PostgreSQL's default
// (the key), as most databases have it.
var tables = []string{"customers", "products", "orders", "order_items", "payments"}

const mark = "lakeflow demo"

// marked sets the demo tables' comment.
func marked() string {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "COMMENT ON TABLE %s IS '%s';\n", t, mark)
	}
	return b.String()
}

// CheckSource refuses a source database that holds a relation of a demo
// table's name that the demo did not create: Setup would change it (its
// comment) and the workload write into it or fail on it,
// leaving the source with a slot and publication for a run that never
// was. A database lakeflow runs itself needs no check.
func CheckSource(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("%w: demo: connect to source: %v", fault.ErrUnavailable, err)
	}
	defer conn.Close(context.Background())
	rows, _ := conn.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relname = ANY($1)
		AND obj_description(c.oid, 'pg_class') IS DISTINCT FROM $2 ORDER BY 1`, tables, mark)
	foreign, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("%w: demo: read the source's tables: %v", fault.ErrSource, err)
	}
	if len(foreign) > 0 {
		return fmt.Errorf("%w: demo: the source database (source.dsn) already has %s, which the demo did not create; --demo creates, fills and changes %s: run it on lakeflow's own PostgreSQL (leave source.dsn unset) or on an empty database",
			fault.ErrConfig, strings.Join(foreign, ", "), strings.Join(tables, ", "))
	}
	return nil
}

// Setup creates the demo schema and, on an empty database, a first
// catalogue of customers and products (which the initial snapshot picks
// up).
func Setup(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("%w: demo: connect to source: %v", fault.ErrUnavailable, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, DDL+marked()); err != nil {
		return fmt.Errorf("%w: demo: create schema: %v", fault.ErrSource, err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM customers").Scan(&n); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if n > 0 {
		return nil
	}
	seed := newShop(0)
	b := &pgx.Batch{}
	for i := 0; i < 200; i++ {
		seed.newCustomer(b, false)
	}
	for i := 0; i < 60; i++ {
		seed.newProduct(b)
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("demo: seed catalogue: %w", err)
	}
	return nil
}

// PrintNextSteps tells the user where the results are; self is how to
// run lakeflow again (go run ., ./lakeflow, lakeflow).
func PrintNextSteps(w io.Writer, cfg *config.Config, self string) {
	fmt.Fprintf(w, `
The demo is in:
  warehouse  %[2]s
  lake       %[3]s

Query it (also while %[1]s run --follow runs):
  %[1]s sql "SELECT status, count(*), sum(total_cents) FROM silver.orders WHERE NOT _deleted GROUP BY ALL ORDER BY 2 DESC"
the lake directly:
  %[1]s sql "SELECT op, count(*) FROM read_parquet('%[4]s', union_by_name = true) GROUP BY op"
or with any DuckDB client of 1.5 or newer, such as the duckdb CLI (no duckdb
here? curl https://install.duckdb.org | sh, or npm install @duckdb/node-api):
  duckdb -readonly %[2]s "SELECT * FROM gold.daily_revenue ORDER BY order_date DESC LIMIT 7"
or the data as it was at any point of the log, and what is wrong with it:
  %[1]s asof --list
  %[1]s check
`, self, cfg.Warehouse.Path, cfg.Lake.Dir, filepath.Join(cfg.Lake.Dir, "orders", "*", "*.parquet"))
}
