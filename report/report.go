// Package report draws lakeflow's state as one self-contained HTML page
// (lakeflow report): throughput and freshness over time, the datasets
// against their SLAs, the lake's files, quarantine and dead letters, the
// last check, schema history, lineage and the gold marts, from the
// published warehouse and the catalog. Charts are inline SVG (gonum/plot);
// the page fetches nothing.
package report

import (
	"context"
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/catalog"
	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/warehouse"
)

// Inputs are what a report is drawn from.
type Inputs struct {
	// Reader reads the published warehouse.
	Reader *warehouse.Reader
	// Catalog is what exists (its lineage is drawn); Contracts give the
	// datasets' SLAs.
	Catalog   catalog.Catalog
	Contracts contracts.Set
	// Since bounds the charts over time; Now is when the report is made.
	Since time.Duration
	Now   time.Time
}

// A Figure is a value shown with the query that gives it (the page
// carries the query, so the value can be checked against lakeflow sql).
type Figure struct {
	Label, Value, SQL string
}

// A Table is a small result shown as it is.
type Table struct {
	Title   string
	Columns []string
	Rows    [][]string
}

// A Chart is a drawn chart, or why there is none.
type Chart struct {
	Title, Caption string
	SVG            template.HTML
	Empty          string
}

// A Dataset is a silver table against its SLA.
type Dataset struct {
	Name       string
	Rows       Figure
	SLA, Age   string
	Late, Kept bool
}

// Page is everything the report shows.
type Page struct {
	Generated, Since   string
	Summary            []Figure
	Throughput, Fresh  Chart
	Datasets           []Dataset
	Lake               Chart
	LakeDays           Table
	Quarantine, Dead   Chart
	QuarantineExamples Table
	CheckedAt          string
	Checks             Table
	Schemas            Chart
	SchemaChanges      Table
	Lineage            template.HTML
	Marts              []Table
}

// Build queries the published warehouse and draws the page.
func Build(ctx context.Context, in Inputs) (*Page, error) {
	b := &builder{ctx: ctx, in: in, since: fmt.Sprintf("now() - INTERVAL %d SECOND", int64(in.Since.Seconds()))}
	p := &Page{Generated: in.Now.UTC().Format(time.RFC3339), Since: in.Since.String()}
	steps := []func(*Page) error{b.summary, b.throughput, b.datasets, b.lake, b.quarantine, b.deadLetters, b.checks, b.schemas, b.marts}
	for _, step := range steps {
		if err := step(p); err != nil {
			return nil, err
		}
	}
	p.Lineage = lineageSVG(in.Catalog)
	return p, nil
}

// builder runs the report's queries.
type builder struct {
	ctx   context.Context
	in    Inputs
	since string // SQL: the start of the charts over time
}

// rows runs q and returns its rows as text ("" for NULL).
func (b *builder) rows(q string) (warehouse.Result, [][]string, error) {
	res, err := b.in.Reader.Query(b.ctx, q, false)
	if err != nil {
		return res, nil, fmt.Errorf("report: %w (%s)", err, oneLine(q))
	}
	out := make([][]string, len(res.Rows))
	for i, r := range res.Rows {
		out[i] = make([]string, len(r))
		for j, v := range r {
			if v != nil {
				out[i][j] = *v
			}
		}
	}
	return res, out, nil
}

// figure is the one value q gives.
func (b *builder) figure(label, q string) (Figure, error) {
	_, rows, err := b.rows(q)
	if err != nil {
		return Figure{}, err
	}
	f := Figure{Label: label, SQL: q}
	if len(rows) > 0 && len(rows[0]) > 0 {
		f.Value = rows[0][0]
	}
	return f, nil
}

// table is q's result as a Table.
func (b *builder) table(title, q string) (Table, error) {
	res, rows, err := b.rows(q)
	return Table{Title: title, Columns: res.Columns, Rows: rows}, err
}

// series reads q's rows (an epoch in seconds, then one value per name)
// as series over time.
func (b *builder) series(q string, names ...string) ([]Series, error) {
	_, rows, err := b.rows(q)
	if err != nil {
		return nil, err
	}
	out := make([]Series, len(names))
	for i, n := range names {
		out[i].Name = n
	}
	for _, r := range rows {
		at, err := strconv.ParseFloat(r[0], 64)
		if err != nil {
			return nil, fmt.Errorf("report: a time %q: %w", r[0], err)
		}
		for i := range names {
			if r[i+1] == "" {
				continue
			}
			v, err := strconv.ParseFloat(r[i+1], 64)
			if err != nil {
				return nil, fmt.Errorf("report: a value %q: %w", r[i+1], err)
			}
			out[i].Points = append(out[i].Points, Point{At: time.Unix(0, int64(at*1e9)), Value: v})
		}
	}
	return out, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
