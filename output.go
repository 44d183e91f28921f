package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/warehouse"
)

// Output formats of query results.
var formats = []string{"text", "csv", "json", "markdown"}

// checkFormat refuses a --format lakeflow does not print.
func checkFormat(f string) error {
	for _, ok := range formats {
		if f == ok {
			return nil
		}
	}
	return fmt.Errorf("%w: --format %q: want %s", fault.ErrConfig, f, strings.Join(formats, ", "))
}

// textRow is a result row of the given values (none NULL).
func textRow(vals ...string) []*string {
	row := make([]*string, len(vals))
	for i := range vals {
		row[i] = &vals[i]
	}
	return row
}

// printJSON prints v as indented JSON.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// querier runs the user's queries: the warehouse, or an as-of one.
type querier interface {
	Query(ctx context.Context, q string, asJSON bool) (warehouse.Result, error)
	CSV(ctx context.Context, q string, out io.Writer) error
}

// printQuery prints the result of the user's query q in the command's
// --format. A query DuckDB refuses is the user's to fix.
func printQuery(c *cli.Context, db querier, q string) error {
	format := c.String("format")
	if format == "csv" {
		err := db.CSV(c.Context, q, os.Stdout)
		if err != nil && !errors.Is(err, fault.ErrEnvironment) {
			err = queryError(q, err)
		}
		return err
	}
	res, err := db.Query(c.Context, q, format == "json")
	if err != nil {
		return queryError(q, err)
	}
	return printResult(os.Stdout, res, format)
}

// readers are the words a query that reads starts with.
var readers = []string{"SELECT", "WITH", "FROM", "VALUES", "TABLE", "DESCRIBE", "SHOW", "SUMMARIZE", "PIVOT", "UNPIVOT"}

// queryError is a query's failure in the user's terms: a statement that
// does not read is named as such, and DuckDB's excerpt of the statement
// (which shows the SELECT the query is wrapped in, not the query) left
// out.
func queryError(q string, err error) error {
	rest := strings.TrimLeft(q, " \t\r\n(")
	for strings.HasPrefix(rest, "--") {
		_, rest, _ = strings.Cut(rest, "\n")
		rest = strings.TrimLeft(rest, " \t\r\n(")
	}
	word := strings.TrimRight(strings.Fields(rest + " ;")[0], ";")
	if word != "" && !slices.Contains(readers, strings.ToUpper(word)) {
		if hint := fault.DidYouMean(word, readers); hint != "" {
			return fmt.Errorf("%w: %s is no SQL keyword a query starts with%s", fault.ErrQuery, word, hint)
		}
		return fmt.Errorf("%w: only queries that read run here (%s …), not %s", fault.ErrQuery, strings.Join(readers[:4], ", "), strings.ToUpper(word))
	}
	return fmt.Errorf("%w: %s", fault.ErrQuery, fault.Plain(err))
}

// printResult prints a query result: aligned text (NULL shown as NULL),
// CSV with a header (NULL as an empty field), one JSON object per line,
// or a Markdown table.
func printResult(w io.Writer, r warehouse.Result, format string) error {
	switch format {
	case "json":
		for _, row := range r.JSON {
			if _, err := fmt.Fprintln(w, row); err != nil {
				return err
			}
		}
		return nil
	case "csv":
		cw := csv.NewWriter(w)
		if err := cw.Write(r.Columns); err != nil {
			return err
		}
		rec := make([]string, len(r.Columns))
		for _, row := range r.Rows {
			for i, v := range row {
				rec[i] = ""
				if v != nil {
					rec[i] = *v
				}
			}
			if err := cw.Write(rec); err != nil {
				return err
			}
		}
		cw.Flush()
		return cw.Error()
	}
	cells := make([][]string, 0, len(r.Rows)+1)
	cells = append(cells, r.Columns)
	for _, row := range r.Rows {
		line := make([]string, len(row))
		for i, v := range row {
			line[i] = "NULL"
			if v != nil {
				line[i] = *v
			}
			if format == "markdown" {
				line[i] = strings.ReplaceAll(line[i], "|", `\|`)
			}
			line[i] = strings.ReplaceAll(line[i], "\n", `\n`)
		}
		cells = append(cells, line)
	}
	md := format == "markdown"
	widths := make([]int, len(r.Columns))
	for _, line := range cells {
		for i, c := range line {
			widths[i] = max(widths[i], utf8.RuneCountInString(c), 3)
		}
	}
	sep, edge := "  ", ""
	if md {
		sep, edge = " | ", "|"
	}
	var b strings.Builder
	row := func(line []string) {
		if md {
			b.WriteString(edge + " ")
		}
		for i, c := range line {
			if i > 0 {
				b.WriteString(sep)
			}
			b.WriteString(c)
			if i < len(line)-1 || md {
				b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)))
			}
		}
		if md {
			b.WriteString(" " + edge)
		}
		b.WriteByte('\n')
	}
	row(cells[0])
	rule := make([]string, len(widths))
	for i, n := range widths {
		rule[i] = strings.Repeat("-", n)
	}
	row(rule)
	for _, line := range cells[1:] {
		row(line)
	}
	if !md {
		plural := "s"
		if len(r.Rows) == 1 {
			plural = ""
		}
		fmt.Fprintf(&b, "(%d row%s)\n", len(r.Rows), plural)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
