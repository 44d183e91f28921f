package pipeline

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// sourceColumn is a column of a source table, as the oracle sees it.
type sourceColumn struct {
	name, typname, category string
}

// canonical returns SQL that renders a column to the same text on both
// sides, whatever type lakeflow chose: PostgreSQL and DuckDB print dates,
// intervals, bytes and floats differently. NULL stays NULL.
func (c sourceColumn) canonical() (pg, duck string) {
	pg, duck = c.render()
	q := pgx.Identifier{c.name}.Sanitize()
	return "CASE WHEN " + q + " IS NULL THEN NULL ELSE " + pg + " END",
		"CASE WHEN " + q + " IS NULL THEN NULL ELSE " + duck + " END"
}

func (c sourceColumn) render() (pg, duck string) {
	q := pgx.Identifier{c.name}.Sanitize()
	switch {
	case c.category == "A":
		return "array_to_json(" + q + ")::text", "to_json(" + q + ")::VARCHAR"
	}
	switch c.typname {
	case "bytea":
		return "encode(" + q + ", 'hex')", "lower(hex(" + q + "))"
	case "date":
		return fmt.Sprintf("CASE WHEN isfinite(%[1]s) THEN (%[1]s - DATE '1970-01-01')::text ELSE %[1]s::text END", q),
			fmt.Sprintf("CASE WHEN isinf(%[1]s) THEN (CASE WHEN %[1]s > DATE '1970-01-01' THEN 'infinity' ELSE '-infinity' END) ELSE (%[1]s - DATE '1970-01-01')::VARCHAR END", q)
	case "timestamp", "timestamptz":
		return fmt.Sprintf("CASE WHEN isfinite(%[1]s) THEN ((extract(epoch FROM %[1]s) * 1000000)::numeric(30,0))::text ELSE %[1]s::text END", q),
			fmt.Sprintf("CASE WHEN isinf(%[1]s) THEN (CASE WHEN %[1]s > '1970-01-01' THEN 'infinity' ELSE '-infinity' END) ELSE epoch_us(%[1]s)::VARCHAR END", q)
	case "time":
		return fmt.Sprintf("((extract(epoch FROM %s) * 1000000)::bigint)::text", q),
			fmt.Sprintf("((datepart('hour', %[1]s) * 3600 + datepart('minute', %[1]s) * 60) * 1000000::BIGINT + datepart('microseconds', %[1]s))::VARCHAR", q)
	case "interval":
		return fmt.Sprintf("format('%%s|%%s|%%s', (extract(year FROM %[1]s) * 12 + extract(month FROM %[1]s))::int, extract(day FROM %[1]s)::int, ((extract(hour FROM %[1]s) * 3600 + extract(minute FROM %[1]s) * 60 + extract(second FROM %[1]s)) * 1000000)::bigint)", q),
			fmt.Sprintf("format('{}|{}|{}', datepart('year', %[1]s) * 12 + datepart('month', %[1]s), datepart('day', %[1]s), (datepart('hour', %[1]s) * 3600 + datepart('minute', %[1]s) * 60) * 1000000::BIGINT + datepart('microseconds', %[1]s))", q)
	case "float4", "float8":
		return q + "::float8::text", "CAST(" + q + " AS DOUBLE)::VARCHAR"
	case "money":
		return q + "::numeric::text", "CAST(" + q + " AS VARCHAR)"
	case "bpchar":
		return "format('%s', " + q + ")", "CAST(" + q + " AS VARCHAR)"
	}
	return q + "::text", "CAST(" + q + " AS VARCHAR)"
}

func (c sourceColumn) normalize(v string) string {
	if c.typname == "float4" || c.typname == "float8" {
		f, err := strconv.ParseFloat(strings.Replace(strings.ToLower(v), "infinity", "inf", 1), 64)
		if err == nil {
			if math.IsNaN(f) {
				return "NaN"
			}
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
	}
	return v
}

func sourceColumns(t *testing.T, conn *pgx.Conn, table string) []sourceColumn {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT a.attname, coalesce(bt.typname, ty.typname), ty.typcategory::text
		FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid
		LEFT JOIN pg_type bt ON ty.typtype = 'd' AND bt.oid = ty.typbasetype
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
		ORDER BY a.attnum`, table)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sourceColumn, error) {
		var c sourceColumn
		return c, r.Scan(&c.name, &c.typname, &c.category)
	})
	if err != nil || len(cols) == 0 {
		t.Fatalf("columns of %s: %v", table, err)
	}
	return cols
}

// assertSilverEqualsSource compares silver.<table> (rows not deleted) with
// the source table row by row and column by column. Tables are named as
// in source.tables (public by default). Stored generated columns are not
// captured (pgoutput does not send them).
func assertSilverEqualsSource(t *testing.T, dsn, warehouse string, tables ...string) {
	t.Helper()
	assertSilverEqualsSourceExcept(t, dsn, warehouse, nil, tables...)
}

// assertSilverEqualsSourceExcept is assertSilverEqualsSource leaving out,
// on both sides, the rows of a table for which skip[table] (SQL that
// PostgreSQL and DuckDB both read) holds.
func assertSilverEqualsSourceExcept(t *testing.T, dsn, warehouse string, skip map[string]string, tables ...string) {
	t.Helper()
	ctx := context.Background()
	conn := pgtest.Connect(t, dsn)
	db := openDuck(t, warehouse)
	defer db.Close()
	for _, name := range tables {
		ct, err := config.ParseTable(name)
		if err != nil {
			t.Fatal(err)
		}
		table, source, silver := ct.Name, pgx.Identifier{ct.Schema, ct.Name}.Sanitize(), "silver."+pgx.Identifier{ct.Name}.Sanitize()
		cols := sourceColumns(t, conn, source)
		var silverCols []string
		// Columns the source dropped stay in silver (retired).
		rows, err := db.QueryContext(ctx, `SELECT column_name FROM information_schema.columns WHERE table_schema = 'silver' AND table_name = ?
			AND column_name NOT IN (SELECT unnest(from_json(schema->'$.retired[*].name', '["VARCHAR"]'))
			                        FROM lakeflow.tables WHERE silver_table = 'silver.' || ?)
			ORDER BY ordinal_position`, table, table)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var n string
			rows.Scan(&n)
			silverCols = append(silverCols, n)
		}
		rows.Close()
		// Columns added at the source come after lakeflow's own.
		var want []string
		for _, c := range cols {
			want = append(want, c.name)
		}
		want = append(want, "_cdc_seq", "_cdc_ord", "_commit_ts", "_deleted")
		slices.Sort(want)
		slices.Sort(silverCols)
		if !slices.Equal(silverCols, want) {
			t.Fatalf("silver.%s columns %v, want %v", table, silverCols, want)
		}
		var pgExprs, duckExprs []string
		for _, c := range cols {
			p, d := c.canonical()
			pgExprs = append(pgExprs, p)
			duckExprs = append(duckExprs, d)
		}
		keep := "true"
		if skip[table] != "" {
			keep = "NOT (" + skip[table] + ")"
		}
		pgQuery := fmt.Sprintf("SELECT %s FROM %s WHERE %s", strings.Join(pgExprs, ", "), source, keep)
		pgr, err := conn.Query(ctx, pgQuery)
		if err != nil {
			t.Fatalf("%s: %v", pgQuery, err)
		}
		src := collect(t, pgr, cols)
		pgr.Close()
		duckQuery := fmt.Sprintf("SELECT %s FROM %s WHERE NOT _deleted AND %s", strings.Join(duckExprs, ", "), silver, keep)
		dr, err := db.Query(duckQuery)
		if err != nil {
			t.Fatalf("%s: %v", duckQuery, err)
		}
		got := collect(t, dr, cols)
		dr.Close()
		diffRows(t, table, src, got)
		// One row per key, deleted ones too: silver has no PRIMARY KEY
		// constraint, the merge alone keeps keys unique.
		if keys := primaryKey(t, conn, source); len(keys) > 0 {
			var dup int
			queryRow(t, db, fmt.Sprintf("SELECT count(*) FROM (SELECT 1 FROM %s GROUP BY %s HAVING count(*) > 1)", silver, strings.Join(keys, ", ")), &dup)
			if dup > 0 {
				t.Errorf("silver.%s: %d keys have more than one row", table, dup)
			}
		}
	}
}

// primaryKey returns the source table's primary key columns, quoted.
func primaryKey(t *testing.T, conn *pgx.Conn, table string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT quote_ident(a.attname) FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY a.attnum`, table)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// scanner is what pgx.Rows and *sql.Rows have in common.
type scanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// collect renders every row as one canonical string.
func collect(t *testing.T, rows scanner, cols []sourceColumn) []string {
	t.Helper()
	var out []string
	for rows.Next() {
		vals := make([]*string, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		out = append(out, rowString(cols, vals))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func rowString(cols []sourceColumn, vals []*string) string {
	parts := make([]string, len(vals))
	for i, v := range vals {
		if v == nil {
			parts[i] = "∅"
		} else {
			parts[i] = strconv.Quote(cols[i].normalize(*v))
		}
	}
	return strings.Join(parts, " | ")
}

func diffRows(t *testing.T, table string, want, got []string) {
	t.Helper()
	count := map[string]int{}
	for _, r := range want {
		count[r]++
	}
	for _, r := range got {
		count[r]--
	}
	var missing, extra []string
	for r, n := range count {
		for ; n > 0; n-- {
			missing = append(missing, r)
		}
		for ; n < 0; n++ {
			extra = append(extra, r)
		}
	}
	if len(missing)+len(extra) == 0 {
		return
	}
	slices.Sort(missing)
	slices.Sort(extra)
	show := func(rs []string) string {
		var lines []string
		for i, r := range rs {
			if i == 5 {
				lines = append(lines, fmt.Sprintf("… %d more", len(rs)-5))
				break
			}
			if len(r) > 600 {
				r = r[:600] + "…"
			}
			lines = append(lines, r)
		}
		return strings.Join(lines, "\n    ")
	}
	t.Errorf("silver.%s differs from the source (%d source rows, %d silver rows)\n  missing from silver:\n    %s\n  not in source:\n    %s",
		table, len(want), len(got), show(missing), show(extra))
}

// openDuck opens a warehouse read-only; close it before lakeflow runs
// again in this process.
func openDuck(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("duckdb", path+"?access_mode=READ_ONLY")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec("SET TimeZone = 'UTC'"); err != nil {
		t.Fatal(err)
	}
	return db
}

// openDuckRW opens a warehouse for writing; close it before lakeflow runs
// again in this process.
func openDuckRW(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("duckdb", path)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	return db
}

// heldBack returns, for each of the tables (as assertSilverEqualsSource
// names them) with changes in the warehouse's lakeflow.quarantine, SQL
// that PostgreSQL and DuckDB both read, true for the rows of those keys:
// silver holds what came before their held changes, not the source's.
func heldBack(t *testing.T, warehouse string, tables ...string) map[string]string {
	t.Helper()
	db := openDuck(t, warehouse)
	defer db.Close()
	out := map[string]string{}
	for _, name := range tables {
		ct, err := config.ParseTable(name)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.Query("SELECT DISTINCT key::VARCHAR FROM lakeflow.quarantine WHERE source_table = ?", ct.String())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for rows.Next() {
			var text string
			var key map[string]any
			if err := rows.Scan(&text); err != nil || json.Unmarshal([]byte(text), &key) != nil {
				t.Fatalf("lakeflow.quarantine key %q: %v", text, err)
			}
			var cols []string
			for col, v := range key {
				cols = append(cols, fmt.Sprintf("%s = '%v'", pgx.Identifier{col}.Sanitize(), v))
			}
			slices.Sort(cols)
			keys = append(keys, "("+strings.Join(cols, " AND ")+")")
		}
		rows.Close()
		if len(keys) > 0 {
			out[ct.Name] = strings.Join(keys, " OR ")
		}
	}
	return out
}
