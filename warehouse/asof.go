package warehouse

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// The warehouse lakeflow asof builds (OpenView + Replay with a bound)
// says which position it reflects, and is queried by the command.

// RecordAsOf writes lakeflow.asof: the position the warehouse reflects,
// as the user gave it, as the bound it resolved to (a _cdc_seq and its
// LSN), and the commit time asked for, if one was.
func (w *Warehouse) RecordAsOf(ctx context.Context, given string, b Bound, at time.Time) error {
	commit := "NULL"
	if !at.IsZero() {
		commit = fmt.Sprintf("make_timestamptz(%d)", at.UnixMicro())
	}
	return w.exec(ctx, []string{
		`CREATE OR REPLACE TABLE lakeflow.asof (position VARCHAR NOT NULL, _cdc_seq UBIGINT NOT NULL, lsn VARCHAR NOT NULL, commit_ts TIMESTAMPTZ,
			built_at TIMESTAMPTZ NOT NULL)`,
		fmt.Sprintf("INSERT INTO lakeflow.asof VALUES (%s, %d, %s, %s, now())", literal(given), uint64(b.Seq), literal(b.Seq.String()), commit),
	})
}

// DropState drops, from a warehouse built as of a position, the
// operations tables only a pipeline fills (where it stands in Kafka and
// the source, its batches, lake files and dead letters): what is left is
// silver, history, gold, the quarantine, the tables' schemas and marts,
// and lakeflow.asof.
func (w *Warehouse) DropState(ctx context.Context) error {
	var stmts []string
	for _, t := range []string{"offsets", "batches", "source_state", "lake_files", "dlq", "gold_pending"} {
		stmts = append(stmts, "DROP TABLE IF EXISTS lakeflow."+t)
	}
	return w.exec(ctx, stmts)
}

// Result is a query's result as text: each value as DuckDB casts it to
// VARCHAR (nil: NULL); or, with JSON, each row as a JSON object.
type Result struct {
	Columns []string
	Rows    [][]*string
	JSON    []string
}

// Query runs a read-only query and returns its result as text (or JSON
// rows), in the query's order.
func (w *Warehouse) Query(ctx context.Context, q string, asJSON bool) (Result, error) {
	if _, err := w.conn.ExecContext(ctx, "SET preserve_insertion_order = true"); err != nil {
		return Result{}, err
	}
	return query(ctx, w.conn, q, asJSON)
}

// query runs q on conn and returns its result as text (or JSON rows).
func query(ctx context.Context, conn *sql.Conn, q string, asJSON bool) (Result, error) {
	var res Result
	q = strings.TrimRight(strings.TrimSpace(q), "; \t\n")
	wrapped := fmt.Sprintf("SELECT COLUMNS(*)::VARCHAR FROM (%s\n)", q)
	if asJSON {
		wrapped = fmt.Sprintf("SELECT to_json(lakeflow_row)::VARCHAR FROM (%s\n) AS lakeflow_row", q)
	}
	rows, err := conn.QueryContext(ctx, wrapped)
	if err != nil {
		return res, err
	}
	defer rows.Close()
	if res.Columns, err = rows.Columns(); err != nil {
		return res, err
	}
	for rows.Next() {
		vals := make([]*string, len(res.Columns))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return res, err
		}
		if asJSON {
			res.JSON = append(res.JSON, finiteJSON(*vals[0]))
			continue
		}
		res.Rows = append(res.Rows, vals)
	}
	return res, rows.Err()
}

// SearchPath makes queries find tables of these schemas by name alone.
func (w *Warehouse) SearchPath(ctx context.Context, schemas ...string) error {
	_, err := w.conn.ExecContext(ctx, "SET search_path = "+literal(strings.Join(schemas, ",")))
	return err
}

// QueryRow runs a query of one row into dst.
func (w *Warehouse) QueryRow(ctx context.Context, q string, dst ...any) error {
	return w.conn.QueryRowContext(ctx, q).Scan(dst...)
}

// LakeViews creates, in schema lake, a view of each table's lake events
// up to b (lake.orders: op, before, after, _cdc_seq, …), named as the
// catalog names them.
func (w *Warehouse) LakeViews(ctx context.Context, b Bound) error {
	stmts := []string{"CREATE SCHEMA IF NOT EXISTS lake"}
	for _, t := range w.tables {
		parts, err := w.parts(lakeDir(t.schema))
		if err != nil {
			return err
		}
		var files []string
		for _, p := range parts {
			if b.admits(p) {
				files = append(files, w.lake.Abs(p.Path))
			}
		}
		if len(files) == 0 {
			continue
		}
		stmts = append(stmts, fmt.Sprintf("CREATE OR REPLACE VIEW lake.%s AS SELECT * FROM read_parquet(%s, union_by_name = true) WHERE _cdc_seq <= %d",
			ident(lakeDir(t.schema)), sqlList(files), uint64(b.Seq)))
	}
	return w.exec(ctx, stmts)
}

// Violations runs a check's query and returns how many rows it gives
// and up to n of them as JSON objects.
func (w *Warehouse) Violations(ctx context.Context, query string, n int) (int64, []string, error) {
	rows, err := w.conn.QueryContext(ctx, fmt.Sprintf("SELECT count(*) OVER (), to_json(v)::VARCHAR FROM (%s\n) v LIMIT %d",
		strings.TrimRight(strings.TrimSpace(query), ";"), n))
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	var total int64
	var out []string
	for rows.Next() {
		var row string
		if err := rows.Scan(&total, &row); err != nil {
			return 0, nil, err
		}
		out = append(out, row)
	}
	return total, out, rows.Err()
}

// QueryRows runs a query whose columns after the first are counts, and
// returns them per row (the first column, a label, as 0).
func (w *Warehouse) QueryRows(ctx context.Context, q string) ([][]int64, error) {
	rows, err := w.conn.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var out [][]int64
	for rows.Next() {
		vals := make([]int64, len(cols))
		ptrs := make([]any, len(cols))
		var label any
		ptrs[0] = &label
		for i := 1; i < len(cols); i++ {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		out = append(out, vals)
	}
	return out, rows.Err()
}

// CheckResult is one result of lakeflow check, as lakeflow.checks keeps
// it: a check that failed (error or warning), or, with Check "passed",
// how many checks of a part passed.
type CheckResult struct {
	Part, Check, Severity, Dataset string
	Count                          int64
	Examples                       []string
	Message                        string
}

// RecordChecks adds the results of one run of the checks to
// lakeflow.checks, in one transaction.
func (w *Warehouse) RecordChecks(ctx context.Context, at time.Time, results []CheckResult) error {
	return w.inTx(ctx, func(ctx context.Context) error {
		for _, r := range results {
			if _, err := w.conn.ExecContext(ctx, "INSERT INTO lakeflow.checks VALUES (?, ?, ?, ?, ?, ?, "+sqlList(r.Examples)+"::VARCHAR[], ?)",
				at, r.Part, r.Check, r.Severity, r.Dataset, r.Count, r.Message); err != nil {
				return err
			}
		}
		return nil
	})
}

// finiteJSON makes DuckDB's JSON text valid JSON: the non-finite floats
// it writes bare (NaN, Infinity, -Infinity) become null.
func finiteJSON(s string) string {
	if !strings.Contains(s, "NaN") && !strings.Contains(s, "Infinity") {
		return s
	}
	var b strings.Builder
	inString := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !inString {
			if tok := nonFinite(s[i:]); tok != "" {
				b.WriteString("null")
				i += len(tok) - 1
				continue
			}
		}
		b.WriteByte(c)
		switch {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(s):
			i++
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// nonFinite is the non-finite float token s starts with, or "".
func nonFinite(s string) string {
	for _, tok := range []string{"-Infinity", "Infinity", "NaN"} {
		if strings.HasPrefix(s, tok) {
			return tok
		}
	}
	return ""
}
