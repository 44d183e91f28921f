package pipeline

import (
	"context"
	"fmt"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// Column drift: each column of the changes a table's lake holds for the
// last closed day (yesterday, UTC), against the day before: a column
// that suddenly fills with NULLs fails check; one whose count of distinct
// values moves tenfold is a warning.

// dayStats are a day's changes of a table: how many, and per column how
// many carry a value and how many distinct values.
type dayStats struct {
	n        int64
	nonNull  []int64
	distinct []int64
}

// driftRows is how many changes each day needs before drift is judged.
const driftRows = 20

// driftSQL gives, for the last two closed days (newest first), the count
// of changes (inserts, updates, snapshot rows) of t in its lake view and,
// per column, the non-NULL and distinct counts of their new values.
func driftSQL(t *change.Table, view string) string {
	cols := []string{"count(*)"}
	for _, c := range t.Columns {
		v := "after." + quoteIdent(c.Name)
		cols = append(cols, "count("+v+")", "count(DISTINCT "+v+")")
	}
	return fmt.Sprintf(`SELECT %s FROM %s
		WHERE op IN ('c', 'u', 'r') AND _commit_ts::DATE IN (current_date - 1, current_date - 2)
		GROUP BY _commit_ts::DATE ORDER BY _commit_ts::DATE DESC`, strings.Join(cols, ", "), view)
}

// driftFindings judges the last closed day's stats against the day
// before's.
func driftFindings(t *change.Table, dataset string, last, before dayStats) []Finding {
	if last.n < driftRows || before.n < driftRows {
		return nil
	}
	var out []Finding
	for i, c := range t.Columns {
		rate := func(s dayStats) float64 { return 1 - float64(s.nonNull[i])/float64(s.n) }
		if now, was := rate(last), rate(before); now-was >= 0.5 {
			out = append(out, Finding{Part: PartData, Check: t.Name + "." + c.Name + ".null_rate", Severity: "error", Dataset: dataset, Count: last.n - last.nonNull[i],
				Message: fmt.Sprintf("%.0f%% of yesterday's changes left %s NULL, against %.0f%% the day before", 100*now, c.Name, 100*was),
				Fix:     "find what stopped filling it at the source"})
		}
		d1, d0 := max(last.distinct[i], 1), max(before.distinct[i], 1)
		if d1 >= 10*d0 || d0 >= 10*d1 {
			out = append(out, Finding{Part: PartData, Check: t.Name + "." + c.Name + ".distinct", Severity: "warning", Dataset: dataset, Count: last.distinct[i],
				Message: fmt.Sprintf("%s took %d distinct values yesterday, %d the day before", c.Name, last.distinct[i], before.distinct[i])})
		}
	}
	return out
}

// drift runs the column drift checks of t over its lake view.
func (r *CheckReport) drift(ctx context.Context, view *AsOf, t *change.Table) error {
	rows, err := view.Counts(ctx, driftSQL(t, "lake."+quoteIdent(change.SafeName(t.Name))))
	if err != nil {
		return err
	}
	if len(rows) < 2 {
		r.Passed[PartData]++ // not two closed days of changes yet
		return nil
	}
	stats := make([]dayStats, 2)
	for d := range stats {
		row := rows[d]
		stats[d].n = row[0]
		for i := range t.Columns {
			stats[d].nonNull = append(stats[d].nonNull, row[1+2*i])
			stats[d].distinct = append(stats[d].distinct, row[2+2*i])
		}
	}
	found := driftFindings(t, "silver."+t.Name, stats[0], stats[1])
	for _, f := range found {
		r.add(f)
	}
	if len(found) == 0 {
		r.Passed[PartData]++
	}
	return nil
}
