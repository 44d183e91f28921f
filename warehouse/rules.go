package warehouse

import (
	"context"
	"fmt"
	"strings"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
)

const quarantineTable = `
CREATE TABLE IF NOT EXISTS lakeflow.quarantine (
	source_table   VARCHAR NOT NULL,
	key            JSON NOT NULL,
	op             VARCHAR NOT NULL,
	rules          VARCHAR[] NOT NULL,
	action         VARCHAR NOT NULL,
	"row"          JSON,
	_cdc_seq       UBIGINT NOT NULL,
	_cdc_ord       UINTEGER NOT NULL,
	_commit_ts     TIMESTAMPTZ NOT NULL,
	quarantined_at TIMESTAMPTZ NOT NULL
);`

// rule is a contract rule of a table.
type rule struct {
	contracts.Rule
}

// SetContracts gives the warehouse the tables' contracts: their rules run
// on every batch from now on, and a table whose contract asks for history
// keeps it from now on (startHistory).
func (w *Warehouse) SetContracts(ctx context.Context, set contracts.Set) error {
	w.contracts = set
	// Every table first: a rule's check reads the table it references as
	// registered under these contracts.
	for topic, t := range w.byTopic {
		w.register(topic, t.schema)
	}
	// Every table's rules are bound before any history starts: contracts
	// refused leave nothing behind.
	for _, t := range w.byTopic {
		if err := w.checkRules(ctx, t); err != nil {
			return err
		}
	}
	for _, t := range w.byTopic {
		if t.history {
			if err := w.startHistory(ctx, t); err != nil {
				return fmt.Errorf("start the history of %s: %w", t.schema.ID(), err)
			}
		}
	}
	return nil
}

// checkRules binds t's rules against its columns as silver holds them: a
// contract that names a column the source table does not have is refused
// here, naming the file, not in the middle of a batch.
func (w *Warehouse) checkRules(ctx context.Context, t *table) error {
	c := w.contracts.For(t.schema.Schema, t.schema.Name)
	if c == nil {
		return nil
	}
	cols := make([]string, len(t.schema.Columns))
	names := make([]string, len(t.schema.Columns))
	for i, col := range t.schema.Columns {
		cols[i] = fmt.Sprintf("CAST(NULL AS %s) AS %s", duckType(col.Type).duck, ident(t.pending.Contract(col.Name)))
		names[i] = col.Name
	}
	has := func(tb *change.Table, col string) bool { return tb.Column(col) >= 0 }
	var problems []string
	for _, r := range t.rules {
		if r.Check != "" {
			q := fmt.Sprintf("DESCRIBE SELECT (%s) FROM (SELECT %s)", r.Check, strings.Join(cols, ", "))
			if _, err := w.conn.ExecContext(ctx, q); err != nil {
				problems = append(problems, fmt.Sprintf("rule %s: %s", r.Name, fault.Plain(err)))
			}
			continue
		}
		u := w.tables[r.References.Table.String()]
		for _, pair := range r.References.Columns {
			if !has(t.schema, t.pending.Column(pair[0])) {
				problems = append(problems, fmt.Sprintf("rule %s: %s has no column %s", r.Name, t.schema.ID(), pair[0]))
			}
			if u != nil && !has(u.schema, u.pending.Column(pair[1])) {
				problems = append(problems, fmt.Sprintf("rule %s: %s has no column %s", r.Name, u.schema.ID(), pair[1]))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: contract %s does not fit the source table %s (columns %s): %s", fault.ErrConfig, c.File, t.schema.ID(),
			strings.Join(names, ", "), strings.Join(problems, "; "))
	}
	return nil
}

// rulesFor compiles the contract rules of a table.
func (w *Warehouse) rulesFor(t *change.Table) []rule {
	c := w.contracts.For(t.Schema, t.Name)
	if c == nil {
		return nil
	}
	out := make([]rule, 0, len(c.Rules))
	for _, r := range c.Rules {
		out = append(out, rule{Rule: r})
	}
	return out
}

// applyRules judges every change of the batch (inserts, updates and
// snapshot rows; deletes always apply) by its table's contract, set-wise:
// one query per table for its row rules and one per existence rule add
// the failures, with the failing row, to lakeflow_failures; then, for all
// tables at once, a change that failed a rule is recorded in
// lakeflow.quarantine once with every rule it failed; one that failed a
// quarantine rule is held back from silver (applySQL). A fail rule stops
// the batch.
func (w *Warehouse) applyRules(ctx context.Context, order []*table, rows map[*table]rowsInfo) (quarantined, warned int, err error) {
	touched := map[*table]bool{}
	var judged []*table
	for _, t := range order {
		touched[t] = true
		if len(t.rules) > 0 {
			judged = append(judged, t)
		}
	}
	if len(judged) == 0 {
		return 0, 0, nil
	}
	if err := w.resetScratch(ctx, "lakeflow_failures"); err != nil {
		return 0, 0, err
	}
	failures := int64(0)
	add := func(sql string) error {
		res, err := w.conn.ExecContext(ctx, sql)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		failures += n
		return nil
	}
	for _, t := range judged {
		if sql := rowRulesSQL(t); sql != "" {
			if err := add(sql); err != nil {
				return 0, 0, fmt.Errorf("check the rules of %s: %w", t.schema.ID(), err)
			}
		}
	}
	// A change held back for a reference is gone for the references to
	// it: a table's existence rules run after those of the tables it
	// references.
	done := map[*table]bool{}
	var check func(t *table) error
	check = func(t *table) error {
		if done[t] || !touched[t] {
			return nil // a table the batch does not touch has nothing to judge
		}
		done[t] = true // a cycle of references is checked in any order
		for _, r := range t.rules {
			if r.References == nil {
				continue
			}
			u := w.tables[r.References.Table.String()]
			switch {
			case u == nil && w.open == 0:
				return fmt.Errorf("%s: rule %s references %s, which is not captured", t.schema.ID(), r.Name, r.References.Table)
			case u != nil:
				if err := check(u); err != nil {
					return err
				}
			}
		}
		for _, r := range t.rules {
			if r.References == nil {
				continue
			}
			sql := ""
			if u := w.tables[r.References.Table.String()]; u != nil {
				sql = referenceSQL(t, u, r.Rule, touched[u], rows[u])
			} else {
				// A part of a snapshot taken before the table it
				// references has its schema: nothing of it exists yet.
				sql = unknownReferenceSQL(t, r.Rule)
			}
			if err := add(sql); err != nil {
				return fmt.Errorf("check rule %s: %w", r.Name, err)
			}
		}
		// Before the tables that reference t read what it holds back.
		return w.deferOpen(ctx, t)
	}
	for _, t := range judged {
		if touched[t] {
			if err := check(t); err != nil {
				return 0, 0, err
			}
		}
	}
	if failures == 0 {
		return 0, 0, nil
	}
	return w.quarantine(ctx, judged)
}

// quarantine records the batch's failures, stops on a fail rule, and
// holds back the changes that failed a quarantine rule.
func (w *Warehouse) quarantine(ctx context.Context, judged []*table) (quarantined, warned int, err error) {
	type tally struct{ held, warned, failed int }
	counts := map[int]tally{}
	rows, err := w.conn.QueryContext(ctx, `SELECT tbl, count(*) FILTER (held), count(*) FILTER (NOT held), count(*) FILTER (failed)
		FROM (SELECT tbl, bool_or(action = 'quarantine') AS held, bool_or(action = 'fail') AS failed FROM lakeflow_failures WHERE action <> 'defer' GROUP BY tbl, kafka_partition, kafka_offset)
		GROUP BY tbl`)
	if err != nil {
		return 0, 0, err
	}
	for rows.Next() {
		var tbl int
		var c tally
		if err := rows.Scan(&tbl, &c.held, &c.warned, &c.failed); err != nil {
			rows.Close()
			return 0, 0, err
		}
		counts[tbl] = c
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	if err := w.stopOnFail(ctx, judged, func(t *table) bool { return counts[t.id].failed > 0 }); err != nil {
		return 0, 0, err
	}
	for _, t := range judged {
		if w.open != 0 {
			n, err := w.recordDeferred(ctx, t)
			if err != nil {
				return 0, 0, fmt.Errorf("record the deferred changes of %s: %w", t.schema.ID(), err)
			}
			if n > 0 {
				w.log.Debug("changes of a transaction applied in parts deferred for an existence rule", "table", t.schema.ID(), "changes", n)
			}
		}
		c := counts[t.id]
		quarantined += c.held
		warned += c.warned
		if c.held+c.warned == 0 {
			continue
		}
		// A batch is judged once: a replay after a crash follows a
		// rollback, and events applied before the Kafka log was lost are
		// dropped before they are judged again (decode).
		_, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow.quarantine
			SELECT %s, %s, r.op, f.rules, CASE WHEN f.held THEN 'quarantine' ELSE 'warn' END, to_json(r.after), r._cdc_seq, r._cdc_ord, r._commit_ts, now()
			FROM %s f JOIN %s r ON r.kafka_partition = f.kafka_partition AND r.kafka_offset = f.kafka_offset`,
			literal(t.schema.ID()), keyJSON(t, "r"), failingChanges(t.id), rowsTable(t.id)))
		if err != nil {
			return 0, 0, fmt.Errorf("record the quarantine of %s: %w", t.schema.ID(), err)
		}
	}
	return quarantined, warned, nil
}

// stopOnFail returns the error that stops ingestion at the first change
// of the batch, by position, that failed a fail rule, if any.
func (w *Warehouse) stopOnFail(ctx context.Context, judged []*table, failed func(*table) bool) error {
	var first *change.Position
	var at, key, rules string
	for _, t := range judged {
		if !failed(t) {
			continue
		}
		var k, r string
		var seq uint64
		var ord uint32
		err := w.conn.QueryRowContext(ctx, fmt.Sprintf(`SELECT %s::VARCHAR, r._cdc_seq, r._cdc_ord, array_to_string(f.fail, ', ')
			FROM %s f JOIN %s r ON r.kafka_partition = f.kafka_partition AND r.kafka_offset = f.kafka_offset
			WHERE f.fail IS NOT NULL ORDER BY r._cdc_seq, r._cdc_ord LIMIT 1`, keyJSON(t, "r"), failingChanges(t.id), rowsTable(t.id))).Scan(&k, &seq, &ord, &r)
		if err != nil {
			return err
		}
		if pos := (change.Position{Seq: change.LSN(seq), Ord: ord}); first == nil || pos.Less(*first) {
			first, at, key, rules = &pos, t.schema.ID(), k, r
		}
	}
	if first == nil {
		return nil
	}
	file := ""
	if c := w.contracts[at]; c != nil {
		file = c.File
	}
	return fmt.Errorf("%w: %s row %s at %s failed %s, whose action is fail: ingestion stopped before applying its batch, and the change stays in Kafka; to go on, change the rule or its action (quarantine, warn) in %s",
		fault.ErrCheckFailed, at, key, *first, rules, file)
}

// withoutHeldBack is a join that leaves out the changes of table tbl,
// aliased r, that failed a quarantine rule or were deferred: they stay
// out of silver. (Deleting them from the rows table instead costs more
// at commit.)
func withoutHeldBack(tbl int, r string) string {
	return fmt.Sprintf(` ANTI JOIN (SELECT kafka_partition, kafka_offset FROM lakeflow_failures WHERE tbl = %d AND action IN ('quarantine', 'defer')) lakeflow_held
		ON lakeflow_held.kafka_partition = %s.kafka_partition AND lakeflow_held.kafka_offset = %s.kafka_offset`, tbl, r, r)
}

// failingChanges is the batch's failing changes of table tbl, one row each with
// every rule it failed (not those deferred).
func failingChanges(tbl int) string {
	return fmt.Sprintf(`(SELECT kafka_partition, kafka_offset, list(DISTINCT rule ORDER BY rule) AS rules, bool_or(action = 'quarantine') AS held,
		list(DISTINCT rule ORDER BY rule) FILTER (action = 'fail') AS fail
		FROM lakeflow_failures WHERE tbl = %d AND action <> 'defer' GROUP BY kafka_partition, kafka_offset)`, tbl)
}

// keyJSON is the key of alias r's row image, as JSON.
func keyJSON(t *table, r string) string {
	var key []string
	for _, i := range t.schema.KeyColumns() {
		n := t.schema.Columns[i].Name
		key = append(key, literal(n)+", "+r+".after."+ident(n))
	}
	// json_object costs a third of to_json(struct_pack(…)).
	return "json_object(" + strings.Join(key, ", ") + ")"
}

// rowRulesSQL adds the failures of the table's changes against its row
// rules to lakeflow_failures. A rule sees the values as silver will hold
// them. It fails when its check is false, or cannot be evaluated for the
// row (a cast that fails); NULL passes, as in a CHECK constraint.
func rowRulesSQL(t *table) string {
	var cases, pass []string
	for _, r := range t.rules {
		if r.Check != "" {
			ok := fmt.Sprintf("try(coalesce((%s), true)) IS TRUE", r.Check)
			cases = append(cases, fmt.Sprintf("CASE WHEN NOT (%s) THEN %s END", ok, literal(string(r.Action)+" "+r.Name)))
			pass = append(pass, ok)
		}
	}
	if len(cases) == 0 {
		return ""
	}
	cols := make([]string, len(t.schema.Columns))
	for i, c := range t.schema.Columns {
		cols[i] = columnValue(c, "s.after") + " AS " + ident(t.pending.Contract(c.Name))
	}
	// Most changes pass every rule: the list of the rules a change fails
	// is built for the others only.
	return fmt.Sprintf(`INSERT INTO lakeflow_failures
SELECT %d, lakeflow_partition, lakeflow_offset, substr(failure, strpos(failure, ' ') + 1), split_part(failure, ' ', 1)
FROM (SELECT lakeflow_partition, lakeflow_offset, unnest(list_filter([%s], x -> x IS NOT NULL)) AS failure
      FROM (SELECT %s, s.kafka_partition AS lakeflow_partition, s.kafka_offset AS lakeflow_offset FROM %s s WHERE s.op IN ('c', 'u', 'r'))
      WHERE NOT (%s))`,
		t.id, strings.Join(cases, ", "), strings.Join(cols, ", "), rowsTable(t.id), strings.Join(pass, " AND "))
}

// unknownReferenceSQL adds the failures of the existence rule r of table
// t when the table it references is not known yet: every change that
// refers to a row fails it.
func unknownReferenceSQL(t *table, r contracts.Rule) string {
	var notNull []string
	for _, pair := range r.References.Columns {
		notNull = append(notNull, "after."+ident(t.pending.Column(pair[0]))+" IS NOT NULL")
	}
	return fmt.Sprintf(`INSERT INTO lakeflow_failures SELECT %d, kafka_partition, kafka_offset, %s, %s FROM %s WHERE op IN ('c', 'u', 'r') AND %s`,
		t.id, literal(r.Name), literal(string(r.Action)), rowsTable(t.id), strings.Join(notNull, " AND "))
}

// referenceSQL adds the failures of the existence rule r of table t: the
// row of u its columns name exists, not deleted, when the change's
// transaction commits (as a deferred foreign key is checked) — after this
// batch's changes of u (uRows describes them) up to that transaction
// that were not held back, else in silver as the batch found it.
// Snapshot rows share one position, so a snapshot row finds the
// snapshot's rows. A truncate of u removes every row before it. A change
// whose columns are NULL refers to nothing and passes.
func referenceSQL(t, u *table, r contracts.Rule, uTouched bool, uRows rowsInfo) string {
	var evCols, refCols, refKeys, on, silverOn, notNull []string
	for i, pair := range r.References.Columns {
		k := fmt.Sprintf("k%d", i)
		evCols = append(evCols, fmt.Sprintf("after.%s AS %s", ident(t.pending.Column(pair[0])), k))
		refCols = append(refCols, fmt.Sprintf("after.%s AS %s", ident(u.pending.Column(pair[1])), k))
		refKeys = append(refKeys, k)
		on = append(on, fmt.Sprintf("ref.%s = ev.%s", k, k))
		silverOn = append(silverOn, fmt.Sprintf("s.%s = ev.%s", ident(u.pending.Column(pair[1])), k))
		notNull = append(notNull, "ev."+k+" IS NOT NULL")
	}
	silver := fmt.Sprintf("EXISTS (SELECT 1 FROM silver.%s s WHERE %s AND NOT s._deleted)", ident(u.schema.Name), strings.Join(silverOn, " AND "))
	alive := silver
	from := fmt.Sprintf("(SELECT kafka_partition, kafka_offset, %s, _cdc_seq AS seq FROM %s WHERE op IN ('c', 'u', 'r')) ev",
		strings.Join(evCols, ", "), rowsTable(t.id))
	if uTouched {
		// The last change of each key in each transaction.
		from += fmt.Sprintf(` ASOF LEFT JOIN (SELECT %s, _cdc_seq AS seq, _cdc_ord AS ord, op <> 'd' AS alive FROM %s u%s
				WHERE op <> 't' QUALIFY row_number() OVER (PARTITION BY %s, _cdc_seq ORDER BY _cdc_ord DESC) = 1) ref
			ON %s AND ev.seq >= ref.seq`, strings.Join(refCols, ", "), rowsTable(u.id), withoutHeldBack(u.id, "u"),
			strings.Join(refKeys, ", "), strings.Join(on, " AND "))
		alive = "coalesce(ref.alive, " + silver + ")"
		if uRows.truncates > 0 {
			// The last truncate of u up to the change's transaction, if
			// it came after the key's last change.
			alive = fmt.Sprintf(`CASE WHEN EXISTS (SELECT 1 FROM %s tr WHERE tr.op = 't' AND tr._cdc_seq <= ev.seq
				AND (ref.seq IS NULL OR tr._cdc_seq > ref.seq OR (tr._cdc_seq = ref.seq AND tr._cdc_ord > ref.ord))) THEN false ELSE %s END`,
				rowsTable(u.id), alive)
		}
	}
	return fmt.Sprintf(`INSERT INTO lakeflow_failures SELECT %d, ev.kafka_partition, ev.kafka_offset, %s, %s FROM %s WHERE %s AND NOT %s`,
		t.id, literal(r.Name), literal(string(r.Action)), from, strings.Join(notNull, " AND "), alive)
}

// referenced is the tables (by source ID) an existence rule of another
// table references: its changes are judged against all of them.
func (w *Warehouse) referenced() map[string]bool {
	out := map[string]bool{}
	for _, t := range w.tables {
		for _, r := range t.rules {
			if r.References != nil {
				out[r.References.Table.String()] = true
			}
		}
	}
	return out
}
