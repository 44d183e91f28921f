package warehouse

import (
	"context"
	"fmt"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// The SCD2 history of a table whose contract asks for it,
// silver.<table>_history, holds one row per committed version of each
// key: its values, valid_from (the commit time of the change that opened
// it), valid_to (that of the change that closed it: the next version, a
// delete or a truncate; NULL while current), is_current, the position
// that opened it (_cdc_seq, _cdc_ord) and the one that closed it
// (_closed_seq, _closed_ord). A version is what a transaction committed:
// a key changed twice in one transaction has one version from it.
// Changes held back by a quarantine rule open none.

// historyMeta are the history table's own columns.
var historyMeta = []string{"valid_from", "valid_to", "is_current", "_cdc_seq", "_cdc_ord", "_closed_seq", "_closed_ord"}

// keepsHistory says t's contract asks for history.
func (w *Warehouse) keepsHistory(t *change.Table) bool {
	if w.view != nil && !w.view.History {
		return false
	}
	c := w.contracts.For(t.Schema, t.Name)
	return c != nil && c.History
}

// historyName is the history table of t, schema-qualified.
func historyName(t *change.Table) string { return "silver." + ident(t.Name+"_history") }

// createHistory creates the history table of t.
func createHistory(t *change.Table) string {
	var cols []string
	for _, c := range imageColumns(t) {
		cols = append(cols, ident(c.Name)+" "+duckType(c.Type).duck)
	}
	cols = append(cols, "valid_from TIMESTAMPTZ NOT NULL", "valid_to TIMESTAMPTZ", "is_current BOOLEAN NOT NULL",
		"_cdc_seq UBIGINT NOT NULL", "_cdc_ord UINTEGER NOT NULL", "_closed_seq UBIGINT", "_closed_ord UINTEGER")
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (%s)", historyName(t), strings.Join(cols, ", "))
}

// startHistory creates the history table of a table that already has
// rows: each live row of silver is a version, current since its change.
// (The versions before are in the lake: lakeflow backfill --all rebuilds
// the whole history.)
func (w *Warehouse) startHistory(ctx context.Context, t *table) error {
	var exists bool
	err := w.conn.QueryRowContext(ctx, "SELECT count(*) > 0 FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'silver' AND table_name = ?",
		t.schema.Name+"_history").Scan(&exists)
	if err != nil || exists {
		return err
	}
	cols := historyColumns(t.schema)
	return w.inTx(ctx, func(ctx context.Context) error {
		return w.exec(ctx, []string{
			createHistory(t.schema),
			fmt.Sprintf(`INSERT INTO %s (%s, %s) SELECT %s, _commit_ts, NULL, true, _cdc_seq, _cdc_ord, NULL, NULL FROM silver.%s WHERE NOT _deleted`,
				historyName(t.schema), cols, strings.Join(historyMeta, ", "), cols, ident(t.schema.Name)),
		})
	})
}

// historyColumns lists the source columns of the history table of t,
// retired ones included, as SQL.
func historyColumns(t *change.Table) string {
	var cols []string
	for _, c := range imageColumns(t) {
		cols = append(cols, ident(c.Name))
	}
	return strings.Join(cols, ", ")
}

// recordHistory records the batch's changes of t, as info describes
// them, in its history.
func (w *Warehouse) recordHistory(ctx context.Context, t *table, info rowsInfo) error {
	return w.exec(ctx, historySQL(t.schema, t.id, len(t.rules) > 0, info, w.midTransaction))
}

// historySQL records a batch's changes of table id in its history, before
// the batch is merged into silver: silver's position for each key says
// which changes the history holds already (a replay adds nothing).
// Per key, the batch's last change of each transaction closes the
// version before it, and opens a version unless it is a delete. A
// truncate (the batch has info.truncates of them) closes every version open
// across it. A batch that continues a transaction the batch before split
// (continues) first takes back the version that transaction's earlier
// part opened.
func historySQL(t *change.Table, id int, judged bool, info rowsInfo, continues bool) []string {
	hist, silver := historyName(t), "silver."+ident(t.Name)
	from := rowsTable(id) + " r"
	if judged {
		from += withoutHeldBack(id, "r")
	}
	var keys, versionKeys, onSilver, onHist, values []string
	for _, i := range t.KeyColumns() {
		n := ident(t.Columns[i].Name)
		keys = append(keys, "after."+n)
		versionKeys = append(versionKeys, "e.img."+n)
		onSilver = append(onSilver, "s."+n+" = e.img."+n)
		onHist = append(onHist, "h."+n+" = s.img."+n)
	}
	// A copied row (op r: a resync, a table captured again) that holds
	// what the key's version before holds — the batch's change before it,
	// else silver's live row — opens no version: the history would
	// otherwise gain a copy of every row at each resync. (Not across a
	// truncate, which closes every version.)
	copied := "false"
	var same, imgKeys []string
	for _, c := range imageColumns(t) {
		values = append(values, columnValue(c, "s.img"))
		same = append(same, fmt.Sprintf("s.%s IS NOT DISTINCT FROM %s", ident(c.Name), duckType(c.Type).silverValue("e.img."+ident(c.Name))))
		if c.Fill.Set() {
			same = nil // its value depends on the row's position: compared no further
			break
		}
	}
	for _, i := range t.KeyColumns() {
		imgKeys = append(imgKeys, "img."+ident(t.Columns[i].Name))
	}
	if same != nil && info.truncates == 0 {
		copied = fmt.Sprintf(`(e.op = 'r' AND CASE WHEN e.prev_op IS NOT NULL THEN e.prev_op <> 'd' AND e.img IS NOT DISTINCT FROM e.prev_img
			ELSE s._cdc_seq IS NOT NULL AND NOT s._deleted AND %s END)`, strings.Join(same, " AND "))
	}
	stmts := []string{
		fmt.Sprintf(`CREATE OR REPLACE TEMP TABLE lakeflow_versions AS
SELECT e.*, row_number() OVER w = 1 AS first, lead(e._cdc_seq) OVER w AS next_seq, lead(e._cdc_ord) OVER w AS next_ord, lead(e._commit_ts) OVER w AS next_ts
FROM (SELECT *, lag(img) OVER k AS prev_img, lag(op) OVER k AS prev_op
      FROM (SELECT after AS img, op, _cdc_seq, _cdc_ord, _commit_ts FROM %s WHERE op <> 't'
            QUALIFY row_number() OVER (PARTITION BY %s, _cdc_seq ORDER BY _cdc_ord DESC) = 1)
      WINDOW k AS (PARTITION BY %s ORDER BY _cdc_seq, _cdc_ord)) e
LEFT JOIN %s s ON %s
WHERE (s._cdc_seq IS NULL OR %s) AND NOT %s
WINDOW w AS (PARTITION BY %s ORDER BY e._cdc_seq, e._cdc_ord)`,
			from, strings.Join(keys, ", "), strings.Join(imgKeys, ", "), silver, strings.Join(onSilver, " AND "), positionLess("s", "e"), copied,
			strings.Join(versionKeys, ", ")),
	}
	on := strings.Join(onHist, " AND ")
	if continues {
		stmts = append(stmts,
			fmt.Sprintf("DELETE FROM %s AS h USING lakeflow_versions s WHERE s.first AND h.is_current AND h._cdc_seq = s._cdc_seq AND %s", hist, on),
			fmt.Sprintf(`UPDATE %s AS h SET _closed_ord = s._cdc_ord FROM lakeflow_versions s
WHERE s.first AND h._closed_seq = s._cdc_seq AND h._closed_ord < s._cdc_ord AND %s`, hist, on))
	}
	stmts = append(stmts,
		fmt.Sprintf(`UPDATE %s AS h SET valid_to = s._commit_ts, is_current = false, _closed_seq = s._cdc_seq, _closed_ord = s._cdc_ord
FROM lakeflow_versions s WHERE s.first AND h.is_current AND %s`, hist, on),
		fmt.Sprintf(`INSERT INTO %s (%s, %s)
SELECT %s, s._commit_ts, s.next_ts, s.next_seq IS NULL, s._cdc_seq, s._cdc_ord, s.next_seq, s.next_ord
FROM lakeflow_versions s WHERE s.op <> 'd'`, hist, historyColumns(t), strings.Join(historyMeta, ", "), strings.Join(values, ", ")))
	for i := range info.truncates {
		stmts = append(stmts, fmt.Sprintf(`UPDATE %s AS h SET valid_to = s._commit_ts, is_current = false, _closed_seq = s._cdc_seq, _closed_ord = s._cdc_ord
FROM (SELECT _cdc_seq, _cdc_ord, _commit_ts FROM %s WHERE op = 't' ORDER BY _cdc_seq, _cdc_ord LIMIT 1 OFFSET %d) s
WHERE %s AND (h.is_current OR s._cdc_seq < h._closed_seq OR (s._cdc_seq = h._closed_seq AND s._cdc_ord < h._closed_ord))`,
			hist, rowsTable(id), i, positionLess("h", "s")))
	}
	return stmts
}
