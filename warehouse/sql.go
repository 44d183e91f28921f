package warehouse

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// rowsTable is the temp table that holds a table's decoded events of the
// batch that are applied, with one image per change, in after: op, after,
// _cdc_seq, _cdc_ord, _commit_ts, kafka_partition, kafka_offset.
func rowsTable(id int) string { return fmt.Sprintf("lakeflow_rows_%d", id) }

// decodedTable holds a table's decoded events of a streamed batch as
// parseSQL gives them, both images and all: what its lake files hold. It
// is in the staging database, where the lake files are written from it
// on a connection of their own beside the rest of the batch.
func decodedTable(id int) string { return fmt.Sprintf("%s.lakeflow_decoded_%d", scratchDB, id) }

// parseSQL turns the staged envelopes of one table into typed rows, the
// shape of a lake file plus its day, whether the before image holds only
// the key, and why an event cannot be applied (dlq_reason, NULL for a
// good one): op, before, after (typed structs), _cdc_seq, _cdc_ord,
// _commit_ts, lsn, tx_id, kafka_topic, kafka_partition, kafka_offset, day,
// key_only, dlq_reason, unchanged (the columns whose TOASTed value an
// update left as it was, NULL in after). It never fails on a bad event:
// every conversion is tried, and what does not convert is named in
// dlq_reason.
func parseSQL(id int, topic string, t *change.Table) string {
	cols := imageColumns(t)
	img := map[string]any{}
	for _, c := range cols {
		img[c.Name] = duckType(c.Type).extract
	}
	readable := formerFields(t)
	for _, f := range t.Formerly {
		if readable[f.Name] {
			img[f.Name] = duckType(imageColumn(t, f.Column).Type).extract
		}
	}
	structure, _ := json.Marshal(map[string]any{
		"op": "VARCHAR", "before": img, "after": img,
		"source":   map[string]string{"lsn": "VARCHAR", "txId": "VARCHAR"},
		"_cdc_seq": "VARCHAR", "_cdc_ord": "VARCHAR", "_commit_ts": "VARCHAR", "_before_key_only": "VARCHAR",
		"_unchanged": "VARCHAR[]",
	})
	// The inner query converts every value once (typed); the outer packs
	// the images and compares typed with raw to find what did not fit.
	var typed []string
	image := func(side string) string {
		fields := make([]string, len(cols))
		for i, c := range cols {
			v := typedName(side, i)
			typed = append(typed, duckType(c.Type).conv(envField(t, side, c))+" AS "+v)
			fields[i] = ident(c.Name) + " := " + v
		}
		return fmt.Sprintf("CASE WHEN j.%s IS NULL THEN NULL ELSE struct_pack(%s) END AS %s", side, strings.Join(fields, ", "), side)
	}
	before, after := image("before"), image("after")
	return fmt.Sprintf(`CREATE OR REPLACE TABLE %s AS
SELECT j.op AS op, %s, %s,
	TRY_CAST(j._cdc_seq AS UBIGINT) AS _cdc_seq, TRY_CAST(j._cdc_ord AS UINTEGER) AS _cdc_ord, TRY_CAST(j._commit_ts AS TIMESTAMPTZ) AS _commit_ts,
	TRY_CAST(j.source.lsn AS UBIGINT) AS lsn, TRY_CAST(j.source.txId AS UBIGINT) AS tx_id,
	%s AS kafka_topic, kafka_partition, kafka_offset,
	CAST(TRY_CAST(j._commit_ts AS TIMESTAMPTZ) AS DATE) AS day, coalesce(TRY_CAST(j._before_key_only AS BOOLEAN), false) AS key_only,
	%s AS dlq_reason, j._unchanged AS unchanged
FROM (SELECT kafka_partition, kafka_offset, j, v, %s
      FROM (SELECT kafka_partition, kafka_offset, v, try(from_json(v, %s)) AS j FROM `+stageTable+` WHERE tbl = %d))`,
		decodedTable(id), before, after, literal(topic), dlqReasonSQL(t), strings.Join(typed, ", "), literal(string(structure)), id)
}

// envField is SQL for the value of column c in image side of the parsed
// envelope j, under the name the column had at the event's position: a
// change made before the source renamed it carries its former name.
func envField(t *change.Table, side string, c change.Column) string {
	field := named(t, side, c)
	if side == "after" && c.Type.Toastable() && !c.Key {
		// Left unchanged (its placeholder is no value): under any name
		// the column had.
		names := []string{literal(c.Name)}
		for _, f := range formerNames(t, c.Name) {
			names = append(names, literal(f.Name))
		}
		field = fmt.Sprintf("CASE WHEN list_has_any(j._unchanged, [%s]) THEN NULL ELSE %s END", strings.Join(names, ", "), field)
	}
	for _, f := range t.Reals {
		if f.Column == c.Name {
			// Before the widening, a real: as PostgreSQL converts it.
			field = fmt.Sprintf("CASE WHEN %s THEN CAST(CAST(TRY_CAST(%s AS FLOAT) AS DOUBLE) AS VARCHAR) ELSE %s END",
				envBefore(f.Before), field, field)
		}
	}
	return field
}

// envBefore is SQL over the parsed envelope j that is true for a change
// made before position p.
func envBefore(p change.Position) string {
	seq, ord := "TRY_CAST(j._cdc_seq AS UBIGINT)", "TRY_CAST(j._cdc_ord AS UINTEGER)"
	return fmt.Sprintf("(%[1]s < %[3]d OR (%[1]s = %[3]d AND %[2]s < %[4]d))", seq, ord, uint64(p.Seq), p.Ord)
}

// named is SQL for the value of column c in image side of j under the
// name it had at the event's position.
func named(t *change.Table, side string, c change.Column) string {
	formers := formerNames(t, c.Name)
	field := "j." + side + "." + ident(c.Name)
	if len(formers) == 0 {
		return field
	}
	fields := formerFields(t)
	var b strings.Builder
	b.WriteString("CASE")
	for _, f := range formers {
		v := "j." + side + "." + ident(f.Name)
		switch {
		case f.Name == "":
			v = "NULL"
		case !fields[f.Name]:
			pointer := "/" + side + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(f.Name)
			v = fmt.Sprintf("try(from_json(json_extract(v, %s), %s))", literal(pointer), literal(`"`+duckType(c.Type).extract+`"`))
		}
		fmt.Fprintf(&b, " WHEN %s THEN %s", envBefore(f.Before), v)
	}
	b.WriteString(" ELSE " + field + " END")
	return b.String()
}

// formerFields are the former names parseSQL parses as fields of the
// envelope: those that no column of the images, nor another former name,
// spells with other case. (A DuckDB struct's fields ignore case, and
// from_json's keys do not.) The others (after a rename that changed case
// alone, or of a name another column took since) are extracted from the
// envelope's text, for the changes from before the rename only.
func formerFields(t *change.Table) map[string]bool {
	taken := map[string]string{}
	for _, c := range imageColumns(t) {
		taken[strings.ToLower(c.Name)] = ""
	}
	keys := map[string]bool{}
	for _, f := range t.Formerly {
		k := strings.ToLower(f.Name)
		if by, ok := taken[k]; f.Name == "" || (ok && by != f.Name) {
			continue
		}
		taken[k] = f.Name
		keys[f.Name] = true
	}
	return keys
}

// imageColumn is the column of t's images named name.
func imageColumn(t *change.Table, name string) change.Column {
	cols := imageColumns(t)
	return cols[slices.IndexFunc(cols, func(c change.Column) bool { return c.Name == name })]
}

// imageColumns are the columns of a table's images, in its rows tables
// and lake files: its columns, then those the source dropped that silver
// keeps (Retired): a change made before the drop carries its value, one
// made after carries none, and leaves it NULL.
func imageColumns(t *change.Table) []change.Column {
	return append(slices.Clone(t.Columns), t.Retired...)
}

// typedName is the alias of a converted value in parseSQL.
func typedName(side string, i int) string { return fmt.Sprintf("lakeflow_%s_%d", side, i) }

// dlqReasonSQL says, in SQL over the parsed envelope j and the converted
// values (typedName), why an event cannot be applied, or NULL: not an
// envelope, a missing field, a key without a value, or a value the
// column's silver type cannot hold (numeric NaN in numeric(p,s), a
// timestamp beyond DuckDB's range).
func dlqReasonSQL(t *change.Table) string {
	var keyNull, unfit []string
	for i, c := range imageColumns(t) {
		ct := duckType(c.Type)
		for _, side := range []string{"after", "before"} {
			x := envField(t, side, c)
			fits := fmt.Sprintf("(%s IS NULL OR %s IS NOT NULL)", x, typedName(side, i))
			if c.Type.IsArray() || ct.toSilver != nil {
				fits = ct.fits(x) // element by element, or as silver holds it
			}
			unfit = append(unfit, fmt.Sprintf("CASE WHEN NOT %s THEN %s || left(%s::VARCHAR, 80) || %s END",
				fits, literal(side+"."+c.Name+" = "), x, literal(" does not fit "+ct.duck)))
		}
		if c.Key {
			keyNull = append(keyNull, fmt.Sprintf("WHEN j.op NOT IN ('t', 'm') AND (CASE WHEN j.after IS NOT NULL THEN %s ELSE %s END) IS NULL THEN %s",
				envField(t, "after", c), envField(t, "before", c), literal("key column "+c.Name+" has no value")))
		}
	}
	return fmt.Sprintf(`CASE
	WHEN j IS NULL THEN 'not a JSON envelope'
	WHEN j.op IS NULL OR j.op NOT IN ('c', 'u', 'd', 'r', 't', 'm') THEN 'op is missing or unknown'
	WHEN TRY_CAST(j._cdc_seq AS UBIGINT) IS NULL OR TRY_CAST(j._cdc_ord AS UINTEGER) IS NULL THEN '_cdc_seq or _cdc_ord is missing'
	WHEN TRY_CAST(j._commit_ts AS TIMESTAMPTZ) IS NULL THEN '_commit_ts is missing or not a time'
	WHEN j.op IN ('c', 'u', 'r') AND j.after IS NULL THEN 'no after image'
	WHEN j.op = 'd' AND j.before IS NULL THEN 'no before image'
	%s
	ELSE nullif(concat_ws('; ', %s), '') END`, strings.Join(keyNull, "\n\t"), strings.Join(unfit, ", "))
}

// applySQL applies a table's decoded events (rowsTable) to silver: the newest change per key
// wins, and only where its (_cdc_seq, _cdc_ord) is newer than the row's,
// so replays and stale events are no-ops. Deletes are soft: the row is
// marked and keeps the values of its last live version. A delete's before
// image is that version, unless it holds only the key (keyOnly: the table
// lacks REPLICA IDENTITY FULL); then the version is the newest insert or
// update of the key in the batch, else what silver holds, so the result
// does not depend on where batches end. A truncate soft-deletes every row
// older than it. latest is the newest change per key (latestSQL, with
// info.keyOnly as given): a subquery, or newestTable. Changes of a judged
// table (one with contract rules) that failed a quarantine rule are left
// out of it: they are held back.
func applySQL(t *change.Table, id int, info rowsInfo, latest string) []string {
	keyOnly := info.keyOnly
	silver := "silver." + ident(t.Name)
	rows := rowsTable(id)
	var names, values, on, final []string
	for _, c := range imageColumns(t) {
		n := ident(c.Name)
		v := columnValue(c, "s.img")
		if keyOnly {
			v = fmt.Sprintf("CASE WHEN NOT s.del THEN %s WHEN s.live IS NOT NULL THEN %s WHEN t._cdc_seq IS NOT NULL THEN t.%s ELSE %s END",
				columnValue(c, "s.img"), liveValue(c), n, columnValue(c, "s.img"))
		}
		insert := columnValue(c, "s.img")
		if keyOnly {
			insert = fmt.Sprintf("CASE WHEN s.del AND s.live IS NOT NULL THEN %s ELSE %s END", liveValue(c), insert)
		}
		names = append(names, n)
		values = append(values, insert)
		final = append(final, v+" AS "+n)
		if c.Key {
			on = append(on, "t."+n+" = s.img."+n)
		}
	}
	meta := []string{"_cdc_seq", "_cdc_ord", "_commit_ts"}
	names = append(names, append(meta, "_deleted")...)
	values = append(values, "s._cdc_seq", "s._cdc_ord", "s._commit_ts", "s.del")
	for _, m := range meta {
		final = append(final, "s."+m)
	}
	final = append(final, "s.del AS _deleted")
	newer := positionLess("t", "s")
	match := strings.Join(on, " AND ")
	var truncate []string
	if info.truncates > 0 {
		truncate = append(truncate, fmt.Sprintf(`UPDATE %[1]s AS t SET _deleted = true, _cdc_seq = s._cdc_seq, _cdc_ord = s._cdc_ord, _commit_ts = s._commit_ts
FROM (SELECT _cdc_seq, _cdc_ord, _commit_ts FROM %[3]s WHERE op = 't' ORDER BY _cdc_seq DESC, _cdc_ord DESC LIMIT 1) AS s
WHERE NOT t._deleted AND %[2]s`, silver, newer, rows))
	}
	if info.empty {
		// What the replacement does to a table without rows, at a
		// fraction of its cost.
		return append([]string{
			fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM %s AS s", silver, strings.Join(names, ", "), strings.Join(values, ", "), latest),
		}, truncate...)
	}
	// The newest change of each key that is newer than silver's row
	// replaces the row: deleted and inserted, not updated in place. DuckDB
	// rewrites every column of a row group that an UPDATE touched at the
	// next checkpoint, and the changes touch row groups all over a grown
	// table, so the checkpoint before each published copy grew with the
	// warehouse and held batches up for 0.3–0.6 s; a delete only marks
	// rows, and the new versions go at the end. (It also keeps the new
	// spelling of an interval that compares equal to the old one, 1 day vs
	// 24:00:00, which UPDATE and MERGE do not.)
	return append([]string{
		fmt.Sprintf(`CREATE OR REPLACE TEMP TABLE lakeflow_latest AS SELECT %s FROM %s AS s LEFT JOIN %s AS t ON %s
			WHERE t._cdc_seq IS NULL OR %s`, strings.Join(final, ", "), latest, silver, match, newer),
		fmt.Sprintf("DELETE FROM %s AS t USING lakeflow_latest AS s WHERE %s", silver, strings.ReplaceAll(match, "s.img.", "s.")),
		fmt.Sprintf("INSERT INTO %s (%s) SELECT * FROM lakeflow_latest", silver, strings.Join(names, ", ")),
	}, truncate...)
}

// newestTable holds latestSQL of table id for a batch whose changes of it
// gold reads: the merge, and the changed rows before and after it, read
// it rather than computing it three times.
func newestTable(id int) string { return fmt.Sprintf("lakeflow_newest_%d", id) }

// latestSQL is the newest change of each key in the batch's rows of
// table id, as info describes them (the changes held back by rules left
// out, if judged): its image (img), whether it deletes (del) and its
// position; with info.keyOnly, also the key's newest after image in the
// batch (live).
func latestSQL(t *change.Table, id int, info rowsInfo, judged bool) string {
	var keyExprs []string
	for _, i := range t.KeyColumns() {
		keyExprs = append(keyExprs, "after."+ident(t.Columns[i].Name))
	}
	keys := strings.Join(keyExprs, ", ")
	live := ""
	if info.keyOnly {
		for _, f := range [][2]string{{"after", "live"}, {"_cdc_seq", "live_seq"}, {"_cdc_ord", "live_ord"}} {
			live += fmt.Sprintf(`, last_value(CASE WHEN op <> 'd' THEN %s END IGNORE NULLS) OVER (PARTITION BY %s ORDER BY _cdc_seq, _cdc_ord
			ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS %s`, f[0], keys, f[1])
		}
	}
	from := rowsTable(id) + " r"
	if judged {
		from += withoutHeldBack(id, "r")
	}
	if !info.keyOnly {
		// An aggregate finds the newest change per key for less than a
		// window; carrying the row ids alone through it, not the
		// images, costs a third less again.
		return fmt.Sprintf(`SELECT after AS img, op = 'd' AS del, _cdc_seq, _cdc_ord, _commit_ts FROM %s
	WHERE rowid IN (SELECT arg_max(r.rowid, _cdc_seq::HUGEINT * 4294967296 + _cdc_ord) FROM %s WHERE op <> 't' GROUP BY %s)`, rowsTable(id), from, keys)
	}
	return fmt.Sprintf(`SELECT after AS img, op = 'd' AS del, _cdc_seq, _cdc_ord, _commit_ts%s
	FROM %s WHERE op <> 't'
	QUALIFY row_number() OVER (PARTITION BY %s ORDER BY _cdc_seq DESC, _cdc_ord DESC) = 1`, live, from, keys)
}

// columnValue is the silver value of column c in image img (a lake
// struct) of an event aliased s: columns added after the event get their
// fill.
func columnValue(c change.Column, img string) string {
	v := duckType(c.Type).silverValue(img + "." + ident(c.Name))
	if c.Fill.Set() {
		// Events older than the column lack it; their rows hold the
		// column's default.
		v = fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", positionBefore("s", c.Fill.Before), fillValue(c), v)
	}
	return v
}

// liveValue is the silver value of column c in the live image (s.live)
// a key-only delete keeps: a column added after that image was written
// gets its fill, whatever the delete's own position.
func liveValue(c change.Column) string {
	v := duckType(c.Type).silverValue("s.live." + ident(c.Name))
	if c.Fill.Set() {
		before := fmt.Sprintf("(s.live_seq < %[1]d OR (s.live_seq = %[1]d AND s.live_ord < %[2]d))", uint64(c.Fill.Before.Seq), c.Fill.Before.Ord)
		v = fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", before, fillValue(c), v)
	}
	return v
}

// positionLess is SQL saying that the position of row a comes before the
// position of row b: the one ordering every guard uses (_cdc_seq, then
// _cdc_ord; DESIGN.md invariant 1), as change.Position.Less does in Go.
func positionLess(a, b string) string {
	return fmt.Sprintf("(%[1]s._cdc_seq < %[2]s._cdc_seq OR (%[1]s._cdc_seq = %[2]s._cdc_seq AND %[1]s._cdc_ord < %[2]s._cdc_ord))", a, b)
}

// positionBefore is SQL saying that the position of row a comes before p.
func positionBefore(a string, p change.Position) string {
	return fmt.Sprintf("(%[1]s._cdc_seq < %[2]d OR (%[1]s._cdc_seq = %[2]d AND %[1]s._cdc_ord < %[3]d))", a, uint64(p.Seq), p.Ord)
}

// fillValue is the SQL value of a column's fill, decoded the way its
// events are: PostgreSQL text → envelope JSON → lake value → silver.
func fillValue(c change.Column) string {
	if c.Fill.Null {
		return "NULL"
	}
	enc, err := change.AppendValue(nil, c.Type, []byte(c.Fill.Text))
	if err != nil {
		return "NULL" // the source's own default text; it always encodes
	}
	ct := duckType(c.Type)
	return ct.silverValue(ct.conv(fmt.Sprintf("from_json(%s, %s)", literal(string(enc)), literal(`"`+ct.extract+`"`))))
}

// fillUnchangedSQL gives the values an update left unchanged in t's rows
// table (TOASTed values PostgreSQL did not log: the table lacks REPLICA
// IDENTITY FULL) the column's value in the row's version before: its
// newest change in the rows that carries the value, else silver's row,
// or the newest quarantined change of the key if it is newer (held back,
// it was still the source's version). Stream and replay both fill them,
// each from the silver and quarantine it builds, so they agree. key is
// the rows' key as lakeflow.quarantine spells it (keyJSON).
//
// A key change is a delete of the old key and, right after it in the
// same transaction, a create of the new one, which can leave values
// unchanged too: its version before is the old key's. An unchanged value
// is never NULL (only stored values are TOASTed), so a filled one
// carries its value to later changes; a chain of key changes in one batch
// is resolved by running the statement again while it fills more
// (unfilledSQL counts what is left).
func fillUnchangedSQL(t *change.Table, id int, key string) string {
	rows := rowsTable(id)
	var own, line, on, prev, fields, held []string
	for _, i := range t.KeyColumns() {
		n := ident(t.Columns[i].Name)
		own = append(own, "after."+n)
		line = append(line, "lakeflow_from."+n)
		on = append(on, fmt.Sprintf("s.%s IS NOT DISTINCT FROM CAST(r.lakeflow_from.%s AS %s)", n, n, duckType(t.Columns[i].Type).duck))
	}
	for i, c := range t.Columns {
		n := ident(c.Name)
		v := "r.after." + n
		if c.Type.Toastable() && !c.Key {
			p := fmt.Sprintf("lakeflow_prev_%d", i)
			carrier := fmt.Sprintf(`last_value(CASE WHEN op IN ('c', 'u', 'r') AND (after.%s IS NOT NULL OR NOT list_contains(coalesce(unchanged, []), %s)) THEN {'v': after.%[1]s} END IGNORE NULLS)
				OVER (PARTITION BY %%s ORDER BY _cdc_seq, _cdc_ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)`, n, literal(c.Name))
			prev = append(prev, fmt.Sprintf("CASE WHEN lakeflow_moved THEN %s ELSE %s END AS %s",
				fmt.Sprintf(carrier, strings.Join(line, ", ")), fmt.Sprintf(carrier, strings.Join(own, ", ")), p))
			// The quarantine keeps the row as JSON: bytes as DuckDB's
			// escaped text, which a cast reads back.
			typ := lakeType(c.Type)
			held = append(held, fmt.Sprintf("%s: %s", jsonString(c.Name), jsonString(strings.ReplaceAll(typ, "BLOB", "VARCHAR"))))
			v = fmt.Sprintf(`CASE WHEN list_contains(r.unchanged, %[1]s) THEN coalesce(r.after.%[3]s, r.%[2]s.v,
				CASE WHEN q.pos IS NOT NULL THEN CAST(q.row.%[3]s AS %[4]s) ELSE CAST(s.%[3]s AS %[4]s) END) ELSE r.after.%[3]s END`,
				literal(c.Name), p, n, typ)
		}
		fields = append(fields, n+" := "+v)
	}
	for _, c := range t.Retired {
		fields = append(fields, ident(c.Name)+" := r.after."+ident(c.Name))
	}
	if len(prev) == 0 {
		return "SELECT 1" // no column can be left unchanged
	}
	newer := "(s._cdc_seq IS NULL OR q.pos > struct_pack(s := s._cdc_seq, o := s._cdc_ord))"
	return fmt.Sprintf(`CREATE OR REPLACE TEMP TABLE %[1]s AS
SELECT r.op, CASE WHEN r.op IN ('u', 'c') AND r.unchanged IS NOT NULL THEN struct_pack(%[2]s) ELSE r.after END AS after,
	r._cdc_seq, r._cdc_ord, r._commit_ts, r.kafka_partition, r.kafka_offset, r.unchanged
FROM (SELECT *, %[3]s, %[4]s AS lakeflow_key
	FROM (SELECT *, coalesce(lakeflow_moved_from, after) AS lakeflow_from, lakeflow_moved_from IS NOT NULL AS lakeflow_moved
		FROM (SELECT *, CASE WHEN op = 'c' AND unchanged IS NOT NULL AND lag(op) OVER o = 'd'
				AND lag(_cdc_seq) OVER o = _cdc_seq AND lag(_cdc_ord) OVER o = _cdc_ord - 1 THEN lag(after) OVER o END AS lakeflow_moved_from
			FROM %[1]s WINDOW o AS (ORDER BY _cdc_seq, _cdc_ord)))) r
LEFT JOIN silver.%[5]s s ON %[6]s
LEFT JOIN (SELECT key::VARCHAR AS key, from_json(arg_max("row", struct_pack(s := _cdc_seq, o := _cdc_ord)), %[7]s) AS row,
		max(struct_pack(s := _cdc_seq, o := _cdc_ord)) AS pos
	FROM lakeflow.quarantine WHERE source_table = %[8]s AND action = 'quarantine' AND op <> 'd' GROUP BY ALL) q
	ON q.key = r.lakeflow_key::VARCHAR AND %[9]s`,
		rows, strings.Join(fields, ", "), strings.Join(prev, ", "), strings.Replace(key, "r.after.", "lakeflow_from.", -1), ident(t.Name), strings.Join(on, " AND "),
		literal("{"+strings.Join(held, ", ")+"}"), literal(t.ID()), newer)
}

// unfilledSQL counts the values fillUnchangedSQL has yet to fill in t's
// rows table.
func unfilledSQL(t *change.Table, id int) string {
	var left []string
	for _, c := range t.Columns {
		if c.Type.Toastable() && !c.Key {
			left = append(left, fmt.Sprintf("(list_contains(unchanged, %s) AND after.%s IS NULL)", literal(c.Name), ident(c.Name)))
		}
	}
	if len(left) == 0 {
		return "SELECT 0"
	}
	return fmt.Sprintf("SELECT count(*) FROM %s WHERE op IN ('u', 'c') AND unchanged IS NOT NULL AND (%s)", rowsTable(id), strings.Join(left, " OR "))
}

// jsonString quotes s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
