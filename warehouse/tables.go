package warehouse

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// Schema is a table schema as the schema topic records it.
type Schema struct {
	Topic string
	Table *change.Table
}

// ApplySchemas creates silver tables for new source schemas and adds the
// columns additive source changes brought, in one transaction that also
// records next, the schema topic offset after these records. Any other
// change is refused: applying it would rewrite history.
func (w *Warehouse) ApplySchemas(ctx context.Context, schemas []Schema, schemaTopic string, next int64) error {
	var stmts []string
	latest := map[string]*change.Table{}
	for _, s := range schemas {
		prevTable, known := latest[s.Topic]
		if !known && w.tables[s.Topic] != nil {
			prevTable = w.tables[s.Topic].schema
		}
		ddl, err := evolve(prevTable, s.Table)
		if err != nil {
			return err
		}
		stmts = append(stmts, ddl...)
		latest[s.Topic] = s.Table
	}
	for topic, t := range latest {
		schemaJSON, err := json.Marshal(t)
		if err != nil {
			return err
		}
		stmts = append(stmts, fmt.Sprintf("INSERT OR REPLACE INTO lakeflow.tables VALUES (%s, %s, %s, %s, now())",
			literal(t.ID()), literal(topic), literal("silver."+t.Name), literal(string(schemaJSON))))
	}
	stmts = append(stmts, fmt.Sprintf(`INSERT OR REPLACE INTO lakeflow.offsets VALUES (%s, 0, %d, now())`, literal(schemaTopic), next))
	if err := w.inTx(ctx, func() error { return w.exec(ctx, stmts) }); err != nil {
		return fmt.Errorf("create or evolve silver tables: %w", err)
	}
	for topic, t := range latest {
		isNew := w.tables[topic] == nil
		w.register(topic, t)
		if isNew {
			if err := w.scanLake(topic, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// evolve returns the DDL that takes silver from prev (nil: no table yet)
// to next.
func evolve(prev, next *change.Table) ([]string, error) {
	if prev == nil {
		return []string{createTable(next)}, nil
	}
	added, err := prev.CheckEvolution(next)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", fault.ErrSchemaBreak, err)
	}
	var ddl []string
	for _, c := range added {
		ddl = append(ddl, fmt.Sprintf("ALTER TABLE silver.%s ADD COLUMN %s %s", ident(next.Name), ident(c.Name), duckType(c.Type).duck))
	}
	return ddl, nil
}

// inTx runs fn in one transaction: committed if fn succeeds, rolled back
// otherwise.
func (w *Warehouse) inTx(ctx context.Context, fn func() error) error {
	if _, err := w.conn.ExecContext(ctx, "BEGIN TRANSACTION"); err != nil {
		return err
	}
	if err := fn(); err != nil {
		_, rbErr := w.conn.ExecContext(context.Background(), "ROLLBACK")
		return errors.Join(err, rbErr)
	}
	if _, err := w.conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func (w *Warehouse) exec(ctx context.Context, stmts []string) error {
	for _, s := range stmts {
		if _, err := w.conn.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

func createTable(t *change.Table) string {
	var cols, keys []string
	for _, c := range t.Columns {
		cols = append(cols, ident(c.Name)+" "+duckType(c.Type).duck)
		if c.Key {
			keys = append(keys, ident(c.Name))
		}
	}
	cols = append(cols,
		"_cdc_seq UBIGINT NOT NULL", "_cdc_ord UINTEGER NOT NULL",
		"_commit_ts TIMESTAMPTZ NOT NULL", "_deleted BOOLEAN NOT NULL")
	// DuckDB cannot index intervals; such keys go without the constraint.
	pk := ""
	if !keyHasInterval(t) {
		pk = ", PRIMARY KEY (" + strings.Join(keys, ", ") + ")"
	}
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS silver.%s (%s%s)", ident(t.Name), strings.Join(cols, ", "), pk)
}

func keyHasInterval(t *change.Table) bool {
	for _, c := range t.Columns {
		if c.Key && c.Type.Kind == change.KindInterval {
			return true
		}
	}
	return false
}

// register remembers a table and prepares the SQL that applies its batches.
func (w *Warehouse) register(topic string, t *change.Table) {
	id := len(w.tables)
	if prev, ok := w.tables[topic]; ok {
		id = prev.id
	}
	w.tables[topic] = &table{id: id, topic: topic, schema: t, parse: parseSQL(id, topic, t), apply: applySQL(t)}
}

// parseSQL turns the staged envelopes of one table into typed rows, the
// shape of a lake file plus its day: op, before, after (typed structs),
// _cdc_seq, _cdc_ord, _commit_ts, lsn, tx_id, kafka_topic,
// kafka_partition, kafka_offset.
func parseSQL(id int, topic string, t *change.Table) string {
	img := map[string]any{}
	for _, c := range t.Columns {
		img[c.Name] = duckType(c.Type).extract
	}
	structure, _ := json.Marshal(map[string]any{
		"op": "VARCHAR", "before": img, "after": img,
		"source":   map[string]string{"lsn": "UBIGINT", "txId": "UBIGINT"},
		"_cdc_seq": "UBIGINT", "_cdc_ord": "UINTEGER", "_commit_ts": "VARCHAR",
	})
	image := func(side string) string {
		x := "j." + side
		fields := make([]string, len(t.Columns))
		for i, c := range t.Columns {
			fields[i] = ident(c.Name) + " := " + duckType(c.Type).conv(x+"."+ident(c.Name))
		}
		return fmt.Sprintf("CASE WHEN %s IS NULL THEN NULL ELSE struct_pack(%s) END AS %s", x, strings.Join(fields, ", "), side)
	}
	return fmt.Sprintf(`CREATE OR REPLACE TEMP TABLE lakeflow_rows AS
SELECT j.op AS op, %s, %s,
	j._cdc_seq AS _cdc_seq, j._cdc_ord AS _cdc_ord, CAST(j._commit_ts AS TIMESTAMPTZ) AS _commit_ts,
	j.source.lsn AS lsn, j.source.txId AS tx_id,
	%s AS kafka_topic, kafka_partition, kafka_offset,
	CAST(CAST(j._commit_ts AS TIMESTAMPTZ) AS DATE) AS day
FROM (SELECT kafka_partition, kafka_offset, from_json(v, %s) AS j FROM lakeflow_stage WHERE tbl = %d)`,
		image("before"), image("after"), literal(topic), literal(string(structure)), id)
}

// applySQL applies lakeflow_rows to silver: the newest change per key
// wins, and only where its (_cdc_seq, _cdc_ord) is newer than the row's,
// so replays and stale events are no-ops. Deletes are soft. A truncate
// soft-deletes every row older than it.
func applySQL(t *change.Table) []string {
	silver := "silver." + ident(t.Name)
	var names, values, sets, on []string
	for _, c := range t.Columns {
		n := ident(c.Name)
		v := duckType(c.Type).silverValue("s.img." + n)
		names = append(names, n)
		values = append(values, v)
		sets = append(sets, n+" = "+v)
		if c.Key {
			on = append(on, "t."+n+" = s.img."+n)
		}
	}
	meta := []string{"_cdc_seq", "_cdc_ord", "_commit_ts", "_deleted"}
	names = append(names, meta...)
	values = append(values, "s._cdc_seq", "s._cdc_ord", "s._commit_ts", "s.del")
	for _, m := range meta[:3] {
		sets = append(sets, m+" = s."+m)
	}
	sets = append(sets, "_deleted = s.del")
	var keyExprs []string
	for _, i := range t.KeyColumns() {
		keyExprs = append(keyExprs, "COALESCE(after, before)."+ident(t.Columns[i].Name))
	}
	latest := fmt.Sprintf(`SELECT COALESCE(after, before) AS img, op = 'd' AS del, _cdc_seq, _cdc_ord, _commit_ts
	FROM lakeflow_rows WHERE op <> 't'
	QUALIFY row_number() OVER (PARTITION BY %s ORDER BY _cdc_seq DESC, _cdc_ord DESC) = 1`, strings.Join(keyExprs, ", "))
	newer := "(s._cdc_seq > t._cdc_seq OR (s._cdc_seq = t._cdc_seq AND s._cdc_ord > t._cdc_ord))"
	match := strings.Join(on, " AND ")
	truncate := fmt.Sprintf(`UPDATE %[1]s AS t SET _deleted = true, _cdc_seq = p._cdc_seq, _cdc_ord = p._cdc_ord, _commit_ts = p._commit_ts
FROM (SELECT _cdc_seq, _cdc_ord, _commit_ts FROM lakeflow_rows WHERE op = 't' ORDER BY _cdc_seq DESC, _cdc_ord DESC LIMIT 1) AS p
WHERE NOT t._deleted AND (t._cdc_seq < p._cdc_seq OR (t._cdc_seq = p._cdc_seq AND t._cdc_ord < p._cdc_ord))`, silver)
	if hasInterval(t) {
		return []string{
			"CREATE OR REPLACE TEMP TABLE lakeflow_latest AS " + latest,
			fmt.Sprintf("DELETE FROM %s AS t USING lakeflow_latest AS s WHERE %s AND %s", silver, match, newer),
			fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM lakeflow_latest AS s WHERE NOT EXISTS (SELECT 1 FROM %s AS t WHERE %s)",
				silver, strings.Join(names, ", "), strings.Join(values, ", "), silver, match),
			truncate,
		}
	}
	return []string{
		fmt.Sprintf(`MERGE INTO %s AS t USING (%s) AS s ON %s
WHEN MATCHED AND %s THEN UPDATE SET %s
WHEN NOT MATCHED THEN INSERT (%s) VALUES (%s)`,
			silver, latest, match, newer, strings.Join(sets, ", "), strings.Join(names, ", "), strings.Join(values, ", ")),
		truncate,
	}
}
