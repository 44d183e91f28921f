package warehouse

import (
	"context"
	"fmt"
	"time"
)

// What lakeflow check reads in a warehouse built from the lake, and what
// a running pipeline records of the checks it runs.

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
		TrimQuery(query), n))
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

// Counts runs a query whose every column is a count, and returns its
// rows.
func (w *Warehouse) Counts(ctx context.Context, q string) ([][]int64, error) {
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
		for i := range vals {
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
