package warehouse

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// What the warehouse and the lake hold, for the dataset catalog.

// TableShape is a table's name (schema.table) and columns (name, DuckDB
// type), in order.
type TableShape struct {
	Name    string
	Columns [][2]string
}

// Shapes describes every table of the silver, gold and lakeflow
// schemas.
func (w *Warehouse) Shapes(ctx context.Context) ([]TableShape, error) {
	rows, err := w.conn.QueryContext(ctx, `SELECT table_schema || '.' || table_name, column_name, data_type
		FROM information_schema.columns WHERE table_catalog = current_database() AND table_schema IN ('silver', 'gold', 'lakeflow')
		ORDER BY table_schema, table_name, ordinal_position`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TableShape
	for rows.Next() {
		var table, col, typ string
		if err := rows.Scan(&table, &col, &typ); err != nil {
			return nil, err
		}
		if len(out) == 0 || out[len(out)-1].Name != table {
			out = append(out, TableShape{Name: table})
		}
		out[len(out)-1].Columns = append(out[len(out)-1].Columns, [2]string{col, typ})
	}
	return out, rows.Err()
}

// LakeShape describes the files of table t in the lake, as its newest
// file has them (lake.<dir>), or returns false if it has none.
func (w *Warehouse) LakeShape(ctx context.Context, t *change.Table) (TableShape, bool, error) {
	s := TableShape{Name: "lake." + lakeDir(t)}
	parts, err := w.parts(lakeDir(t))
	if err != nil || len(parts) == 0 {
		return s, false, err
	}
	newest := slices.MaxFunc(parts, func(a, b lake.Part) int { return cmp.Compare(a.Span.MaxSeq, b.Span.MaxSeq) })
	rows, err := w.conn.QueryContext(ctx, fmt.Sprintf("DESCRIBE SELECT * FROM read_parquet(%s)", literal(w.lake.Abs(newest.Path))))
	if err != nil {
		return s, false, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return s, false, err
	}
	for rows.Next() {
		vals := make([]any, len(cols))
		var name, typ string
		vals[0], vals[1] = &name, &typ
		for i := 2; i < len(vals); i++ {
			vals[i] = new(any)
		}
		if err := rows.Scan(vals...); err != nil {
			return s, false, err
		}
		s.Columns = append(s.Columns, [2]string{name, typ})
	}
	return s, true, rows.Err()
}

// MartLineage is what the catalog says of an active gold mart.
type MartLineage struct {
	Name, File, Description string
	// Reads are the silver tables its SQL reads.
	Reads []string
	// Cadence is when it is refreshed: every batch, every <interval>, or
	// manual.
	Cadence string
}

// Marts describes the active gold marts.
func (w *Warehouse) Marts() []MartLineage {
	var out []MartLineage
	for _, m := range w.marts {
		if !m.active {
			continue
		}
		cadence := "every batch"
		switch {
		case m.refresh.Manual:
			cadence = "manual (lakeflow backfill)"
		case m.refresh.Every > 0:
			cadence = "every " + m.refresh.Every.String()
		}
		out = append(out, MartLineage{Name: m.Name, File: m.File, Description: m.Description, Reads: slices.Clone(m.reads), Cadence: cadence})
	}
	return out
}
