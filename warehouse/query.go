package warehouse

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/lakeflow/lakeflow/internal/fault"
)

// Query results as text, for lakeflow asof, sql and the other commands
// that print what a query gives.

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

// CSV writes the result of a read-only query to out as CSV with a
// header, in the query's order.
func (w *Warehouse) CSV(ctx context.Context, q string, out io.Writer) error {
	if _, err := w.conn.ExecContext(ctx, "SET preserve_insertion_order = true"); err != nil {
		return err
	}
	return writeCSV(ctx, w.conn, q, out)
}

// writeCSV writes q's result to out as CSV with a header (NULL an empty
// field, an empty string ""). DuckDB writes it to a temporary file: a
// fraction of the cost of reading every value through Go.
// Errors other than the query's are fault.ErrEnvironment.
func writeCSV(ctx context.Context, conn *sql.Conn, q string, out io.Writer) error {
	dir, err := os.MkdirTemp("", "lakeflow-csv-")
	if err != nil {
		return fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "result.csv")
	sel, err := utcText(ctx, conn, TrimQuery(q))
	if err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("COPY (%s) TO %s (FORMAT csv, HEADER)", sel, literal(path))); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err == nil {
		_, err = io.Copy(out, f)
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	return nil
}

// utcText selects q's columns with each finite TIMESTAMPTZ as the text
// DuckDB gives it in UTC, the session's zone, made from the TIMESTAMP of
// the same instant: DuckDB formats a TIMESTAMPTZ through ICU's calendar,
// which cost two thirds of writing a table with three of them (80,000
// rows: 111-118 ms, 66-84 ms this way; the text is the same, but past
// the year 287,396, where DuckDB's own is a millisecond off).
func utcText(ctx context.Context, conn *sql.Conn, q string) (string, error) {
	rows, err := conn.QueryContext(ctx, fmt.Sprintf(`SELECT column_name FROM (DESCRIBE SELECT * FROM (%s
))
		WHERE column_type = 'TIMESTAMP WITH TIME ZONE'`, q))
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var texts []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return "", err
		}
		c := ident(name)
		texts = append(texts, fmt.Sprintf("CASE WHEN isfinite(%[1]s) THEN make_timestamp(epoch_us(%[1]s))::VARCHAR || '+00' ELSE %[1]s::VARCHAR END AS %[1]s", c))
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if len(texts) == 0 {
		return fmt.Sprintf("SELECT * FROM (%s\n)", q), nil
	}
	return fmt.Sprintf("SELECT * REPLACE (%s) FROM (%s\n)", strings.Join(texts, ", "), q), nil
}

// TrimQuery is a user's query without the blanks and semicolons around
// it, to be wrapped in another statement.
func TrimQuery(q string) string { return strings.TrimRight(strings.TrimSpace(q), "; \t\n") }

// query runs q on conn and returns its result as text (or JSON rows).
func query(ctx context.Context, conn *sql.Conn, q string, asJSON bool) (Result, error) {
	var res Result
	q = TrimQuery(q)
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

// QueryRow runs a query of one row into dst.
func (w *Warehouse) QueryRow(ctx context.Context, q string, dst ...any) error {
	return w.conn.QueryRowContext(ctx, q).Scan(dst...)
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
