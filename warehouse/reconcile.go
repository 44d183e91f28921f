package warehouse

import (
	"context"
	"fmt"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// reconcile turns the reconcile marks (change.OpReconcile) among t's
// events into deletes: at each mark's position, one for every key whose
// newest version before the mark's copy began (the mark's lsn) is live —
// in silver, or among the batch's own changes — and that no change since
// then wrote, nor a contract held back: a row the copy did not find, gone
// from the source. marks is the relation the marks are read from (with
// op, lsn and the positions): the stream's decoded events or a replay's
// lake files, so both delete the same rows. The deletes carry the key
// alone; the marks leave the rows table.
func (w *Warehouse) reconcile(ctx context.Context, t *table, marks string) error {
	type mark struct {
		lsn, seq       uint64
		ord, partition int64
		ts             string
		offset         int64
	}
	// The marks' positions and offsets as the rows table has them (a
	// replay numbers its events), where each copy began as marks has it;
	// one without (not lakeflow's) deletes nothing.
	rows, err := w.conn.QueryContext(ctx, fmt.Sprintf(`SELECT DISTINCT ON (r._cdc_seq, r._cdc_ord) m.lsn, r._cdc_seq, r._cdc_ord, r._commit_ts::VARCHAR, r.kafka_partition, r.kafka_offset
		FROM %s r JOIN (SELECT lsn, _cdc_seq, _cdc_ord FROM %s WHERE op = 'm' AND lsn IS NOT NULL) m USING (_cdc_seq, _cdc_ord)
		WHERE r.op = 'm' ORDER BY r._cdc_seq, r._cdc_ord`, rowsTable(t.id), marks))
	if err != nil {
		return err
	}
	var list []mark
	for rows.Next() {
		var m mark
		if err := rows.Scan(&m.lsn, &m.seq, &m.ord, &m.ts, &m.partition, &m.offset); err != nil {
			rows.Close()
			return err
		}
		list = append(list, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, m := range list {
		stmt := reconcileSQL(t.schema, t.id, m.lsn, fmt.Sprintf("%d AS _cdc_seq, %d AS _cdc_ord, CAST(%s AS TIMESTAMPTZ) AS _commit_ts, %d AS kafka_partition, %d AS kafka_offset",
			m.seq, m.ord, literal(m.ts), m.partition, m.offset))
		if _, err := w.conn.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf("DELETE FROM %s WHERE op = 'm'", rowsTable(t.id)))
	return err
}

// reconcileSQL adds to t's rows table the deletes of one reconcile mark
// (see reconcile): since is where its copy began, at the mark's position
// columns.
func reconcileSQL(t *change.Table, id int, since uint64, at string) string {
	rows := rowsTable(id)
	var image, keys, fromSilver, same, key []string
	for _, c := range imageColumns(t) {
		n := ident(c.Name)
		v := "NULL"
		if c.Key {
			v = "g." + n
			keys = append(keys, "after."+n)
			fromSilver = append(fromSilver, fmt.Sprintf("CAST(%s AS %s) AS %[1]s", n, lakeType(c.Type)))
			same = append(same, fmt.Sprintf("r.after.%s IS NOT DISTINCT FROM g.%[1]s", n))
			key = append(key, literal(c.Name)+", g."+n)
		}
		image = append(image, fmt.Sprintf("%s := CAST(%s AS %s)", n, v, lakeType(c.Type)))
	}
	return fmt.Sprintf(`INSERT INTO %[1]s BY NAME
SELECT 'd' AS op, struct_pack(%[2]s) AS after, %[3]s, CAST(NULL AS VARCHAR[]) AS unchanged
FROM (SELECT %[4]s FROM silver.%[5]s WHERE NOT _deleted AND _cdc_seq < %[6]d
	UNION
	SELECT after.* FROM (SELECT struct_pack(%[7]s) AS after, op FROM %[1]s WHERE op NOT IN ('m', 't') AND _cdc_seq < %[6]d
		QUALIFY row_number() OVER (PARTITION BY %[8]s ORDER BY _cdc_seq DESC, _cdc_ord DESC) = 1) WHERE op <> 'd') g
WHERE NOT EXISTS (SELECT 1 FROM %[1]s r WHERE r.op NOT IN ('m', 't') AND r._cdc_seq >= %[6]d AND %[9]s)
	AND NOT EXISTS (SELECT 1 FROM lakeflow.quarantine q WHERE q.source_table = %[10]s AND q._cdc_seq >= %[6]d
		AND q.key::VARCHAR = json_object(%[11]s)::VARCHAR)`,
		rows, strings.Join(image, ", "), at, strings.Join(fromSilver, ", "), ident(t.Name), since,
		strings.Join(keyFields(t), ", "), strings.Join(keys, ", "), strings.Join(same, " AND "), literal(t.ID()), strings.Join(key, ", "))
}

// keyFields packs the key columns of a rows table's after image.
func keyFields(t *change.Table) []string {
	var out []string
	for _, i := range t.KeyColumns() {
		n := ident(t.Columns[i].Name)
		out = append(out, n+" := after."+n)
	}
	return out
}
