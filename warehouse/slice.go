package warehouse

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/sql/gold"
)

// SliceStats says what a backfill of days changed.
type SliceStats struct {
	Keys  int // keys whose silver rows and history were replaced
	Marts int // marts refreshed
}

// ReplaceSlice swaps in, from the warehouse file shadow (the lake
// replayed whole, so exact), what the days from to to (commit days of the
// lake's partitions) changed: the silver rows and history of every key
// they changed, the quarantine records of their changes; then it
// recomputes the gold partitions those rows touch, and, for marts with a
// DATE grain, those days. All in one transaction: readers see the old
// slice or the new one. With shadow "", silver stays and only the gold
// marts (only that mart, if only is set) are recomputed.
func (w *Warehouse) ReplaceSlice(ctx context.Context, shadow string, from, to time.Time, only string) (SliceStats, error) {
	var st SliceStats
	if only != "" && !slices.ContainsFunc(w.marts, func(m *mart) bool { return m.Name == only && m.active }) {
		return st, fmt.Errorf("%w: no gold mart %s is set up (see gold.dir)", fault.ErrConfig, only)
	}
	if shadow != "" {
		if _, err := w.conn.ExecContext(ctx, "ATTACH "+literal(shadow)+" AS lakeflow_shadow (READ_ONLY)"); err != nil {
			return st, err
		}
		defer w.conn.ExecContext(context.WithoutCancel(ctx), "DETACH lakeflow_shadow")
	}
	day := func(t time.Time) string { return "DATE " + literal(t.Format(time.DateOnly)) }
	days := DayRange{From: from, To: to}
	former, err := w.renameChains(ctx)
	if err != nil {
		return st, err
	}
	var tables []*table
	for _, t := range w.tables {
		parts, err := w.lake.Parts(lakeDir(t.schema))
		if err != nil {
			return st, err
		}
		var files []string
		for _, p := range parts {
			if days.holds(p.Day) {
				files = append(files, w.lake.Abs(p.Path))
			}
		}
		if len(files) == 0 {
			continue
		}
		if err := w.makeSliceKeys(ctx, t, files, former[t.schema.ID()]); err != nil {
			return st, err
		}
		tables = append(tables, t)
	}
	err = w.inTx(ctx, func(ctx context.Context) error {
		for _, t := range tables {
			in := sliceKeys(t, "s.")
			if err := w.exec(ctx, []string{fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS SELECT s.* FROM silver.%s s WHERE %s", changedTable(t.id), ident(t.schema.Name), in)}); err != nil {
				return err
			}
			if shadow == "" {
				continue
			}
			var n int
			if err := w.conn.QueryRowContext(ctx, "SELECT count(*) FROM "+sliceTable(t.id)).Scan(&n); err != nil {
				return err
			}
			st.Keys += n
			targets := []string{"silver." + ident(t.schema.Name)}
			if t.history {
				targets = append(targets, historyName(t.schema))
			}
			for _, target := range targets {
				src := "lakeflow_shadow." + target
				if err := w.exec(ctx, []string{
					fmt.Sprintf("DELETE FROM %s s WHERE %s", target, in),
					fmt.Sprintf("INSERT INTO %s BY NAME SELECT * FROM %s s WHERE %s", target, src, in),
				}); err != nil {
					return fmt.Errorf("replace the slice of %s: %w", target, err)
				}
			}
			inDays := fmt.Sprintf("source_table = %s AND _commit_ts::DATE BETWEEN %s AND %s", literal(t.schema.ID()), day(from), day(to))
			if err := w.exec(ctx, []string{
				"DELETE FROM lakeflow.quarantine WHERE " + inDays,
				"INSERT INTO lakeflow.quarantine BY NAME SELECT * FROM lakeflow_shadow.lakeflow.quarantine WHERE " + inDays,
				fmt.Sprintf("INSERT INTO %s SELECT s.* FROM silver.%s s WHERE %s", changedTable(t.id), ident(t.schema.Name), in),
			}); err != nil {
				return err
			}
		}
		answers := map[string]string{}
		for _, m := range w.marts {
			if !m.active || (only != "" && m.Name != only) {
				continue
			}
			if m.Grain == gold.Full {
				if err := w.refreshMart(ctx, m, nil); err != nil {
					return err
				}
				st.Marts++
				continue
			}
			var touched []string
			for _, t := range tables {
				if slices.Contains(m.reads, t.schema.Name) {
					tmp, err := w.touchOnce(ctx, m, t.schema.Name, changedTable(t.id), answers)
					if err != nil {
						return err
					}
					touched = append(touched, tmp)
				}
			}
			if m.grainType == "DATE" {
				_, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow.gold_pending
					SELECT %s, d::DATE::VARCHAR FROM range(%s::TIMESTAMP, %s::TIMESTAMP + INTERVAL 1 DAY, INTERVAL 1 DAY) t(d)`, literal(m.Name), day(from), day(to)))
				if err != nil {
					return err
				}
			}
			if err := w.refreshMart(ctx, m, touched); err != nil {
				return err
			}
			st.Marts++
		}
		return w.dropAnswers(ctx, answers)
	})
	return st, err
}

// DayRange is the commit days a backfill of days rebuilds, From to To.
type DayRange struct {
	From, To time.Time
}

// holds says whether day (YYYY-MM-DD, a lake partition's) is in the range.
func (r DayRange) holds(day string) bool {
	d, err := time.Parse(time.DateOnly, day)
	return err == nil && !d.Before(r.From) && !d.After(r.To)
}

// sliceTable holds the keys of table id that a backfill's days changed.
func sliceTable(id int) string { return fmt.Sprintf("lakeflow_slice_%d", id) }

// makeSliceKeys fills sliceTable with the keys (k0, k1, …) of t that the
// lake files changed (a truncate names none); former is what
// renameChains says of t's columns.
func (w *Warehouse) makeSliceKeys(ctx context.Context, t *table, files []string, former map[string][]string) error {
	src := fmt.Sprintf("read_parquet(%s, union_by_name = true)", sqlList(files))
	fields, err := w.structFields(ctx, src)
	if err != nil {
		return err
	}
	keys := lakeKeys(t, fields, former, "COALESCE(after, before)")
	for i := range keys {
		keys[i] += fmt.Sprintf(" AS k%d", i)
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS SELECT DISTINCT %s FROM %s WHERE op <> 't'",
		sliceTable(t.id), strings.Join(keys, ", "), src))
	return err
}

// lakeKeys is, for each key column of t, SQL for its value in img, an
// event's image in lake files whose images have fields: under the name
// the column has now or any it had before (former, from
// renameChains), those the files hold.
func lakeKeys(t *table, fields map[string]bool, former map[string][]string, img string) []string {
	spelled := map[string]string{}
	for f := range fields {
		spelled[strings.ToLower(f)] = f
	}
	var keys []string
	for _, k := range t.schema.KeyColumns() {
		c := t.schema.Columns[k]
		var have []string
		for _, name := range append([]string{c.Name}, former[c.Name]...) {
			if f, ok := spelled[strings.ToLower(name)]; ok {
				have = append(have, fmt.Sprintf("CAST(%s.%s AS %s)", img, ident(f), lakeType(c.Type)))
			}
		}
		if len(have) == 0 {
			have = append(have, "NULL")
		}
		keys = append(keys, "coalesce("+strings.Join(have, ", ")+")")
	}
	return keys
}

// addMovedKeys adds to t's slice keys the keys they were changed from
// (a key change is a delete and a create at the next ordinal of one
// transaction), again and again, over the lake files of t: a create that
// left a TOASTed value unchanged takes it from the key it moved from,
// which the replay must then hold too.
func (w *Warehouse) addMovedKeys(ctx context.Context, t *table, files []string, former map[string][]string) error {
	src := fmt.Sprintf("read_parquet(%s, union_by_name = true)", sqlList(files))
	if cols, err := w.columns(ctx, src); err != nil || !cols["unchanged"] {
		return err // no change in them left a value unchanged
	}
	fields, err := w.structFields(ctx, src)
	if err != nil {
		return err
	}
	var from, to, fk, moved, known []string
	for i, k := range lakeKeys(t, fields, former, "d.img") {
		from = append(from, fmt.Sprintf("%s AS f%d", k, i))
		fk = append(fk, fmt.Sprintf("f%d", i))
		moved = append(moved, fmt.Sprintf("m.k%d = s.k%[1]d", i))
		known = append(known, fmt.Sprintf("m.f%d = s.k%[1]d", i))
	}
	for i, k := range lakeKeys(t, fields, former, "c.img") {
		to = append(to, fmt.Sprintf("%s AS k%d", k, i))
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE TEMP TABLE lakeflow_slice_moves AS
WITH e AS (SELECT op, COALESCE(after, before) AS img, _cdc_seq, _cdc_ord, unchanged FROM %s WHERE op IN ('c', 'd'))
SELECT %s, %s FROM e c JOIN e d ON d.op = 'd' AND d._cdc_seq = c._cdc_seq AND d._cdc_ord = c._cdc_ord - 1
WHERE c.op = 'c' AND c.unchanged IS NOT NULL`, src, strings.Join(from, ", "), strings.Join(to, ", ")))
	if err != nil {
		return err
	}
	defer w.conn.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS lakeflow_slice_moves")
	for {
		res, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %[1]s SELECT DISTINCT %[2]s FROM lakeflow_slice_moves m
			WHERE EXISTS (SELECT 1 FROM %[1]s s WHERE %[3]s) AND NOT EXISTS (SELECT 1 FROM %[1]s s WHERE %[4]s)`,
			sliceTable(t.id), strings.Join(fk, ", "), strings.Join(moved, " AND "), strings.Join(known, " AND ")))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
	}
}

// sliceKeys is SQL saying that the row whose key columns are prefixed by
// r (an alias and a dot, or a struct column and a dot) has a key of the
// slice.
func sliceKeys(t *table, r string) string {
	var on []string
	for i, k := range t.schema.KeyColumns() {
		on = append(on, fmt.Sprintf("k.k%d = %s%s", i, r, ident(t.schema.Columns[k].Name)))
	}
	return fmt.Sprintf("EXISTS (SELECT 1 FROM %s k WHERE %s)", sliceTable(t.id), strings.Join(on, " AND "))
}
