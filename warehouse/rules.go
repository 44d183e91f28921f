package warehouse

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/fault"
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
	quarantined_at TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (source_table, _cdc_seq, _cdc_ord)
);`

// rule is a contract rule compiled for one table.
type rule struct {
	contracts.Rule
	// target is the referenced table of an existence rule.
	target *table
}

// verdictTable is the temp table that holds, per event of the batch,
// the rules it failed, by action.
func verdictTable(id int) string { return fmt.Sprintf("lakeflow_verdict_%d", id) }

// SetContracts gives the warehouse the tables' contracts: their rules run
// on every batch from now on.
func (w *Warehouse) SetContracts(set contracts.Set) {
	w.contracts = set
	for topic, t := range w.byTopic {
		w.register(topic, t.schema)
	}
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
// one query per table for the row rules, one per existence rule. A change
// that fails a rule is recorded in lakeflow.quarantine once, with every
// rule it failed; one that failed a quarantine rule is held back from
// silver; one that failed a fail rule stops the batch.
func (w *Warehouse) applyRules(ctx context.Context, order []*table) (quarantined, warned int, err error) {
	touched := map[*table]bool{}
	var judged []*table
	for _, t := range order {
		touched[t] = true
		if len(t.rules) > 0 {
			judged = append(judged, t)
		}
	}
	for _, t := range judged {
		if _, err := w.conn.ExecContext(ctx, verdictSQL(t)); err != nil {
			return 0, 0, fmt.Errorf("check the rules of %s: %w", t.schema.ID(), err)
		}
	}
	for _, t := range judged {
		for _, r := range t.rules {
			if r.References == nil {
				continue
			}
			u := w.tables[r.References.Table.String()]
			if u == nil {
				return 0, 0, fmt.Errorf("%s: rule %s references %s, which is not captured", t.schema.ID(), r.Name, r.References.Table)
			}
			if _, err := w.conn.ExecContext(ctx, referenceSQL(t, u, r.Rule, touched[u], len(u.rules) > 0)); err != nil {
				return 0, 0, fmt.Errorf("check rule %s: %w", r.Name, err)
			}
		}
	}
	for _, t := range judged {
		q, wn, err := w.quarantine(ctx, t)
		if err != nil {
			return 0, 0, err
		}
		quarantined += q
		warned += wn
	}
	return quarantined, warned, nil
}

// quarantine records the changes of t that failed rules, stops on a fail
// rule, and holds back those that failed a quarantine rule.
func (w *Warehouse) quarantine(ctx context.Context, t *table) (quarantined, warned int, err error) {
	rows, verdict := rowsTable(t.id), verdictTable(t.id)
	var key []string
	for _, i := range t.schema.KeyColumns() {
		n := ident(t.schema.Columns[i].Name)
		key = append(key, n+" := r.after."+n)
	}
	var failTable, failKey, failRules string
	var failSeq uint64
	var failOrd uint32
	err = w.conn.QueryRowContext(ctx, fmt.Sprintf(`SELECT %s, to_json(struct_pack(%s))::VARCHAR, r._cdc_seq, r._cdc_ord, array_to_string(v.fail, ', ')
		FROM %s r JOIN %s v USING (kafka_partition, kafka_offset) WHERE len(v.fail) > 0 ORDER BY r._cdc_seq, r._cdc_ord LIMIT 1`,
		literal(t.schema.ID()), strings.Join(key, ", "), rows, verdict)).Scan(&failTable, &failKey, &failSeq, &failOrd, &failRules)
	switch {
	case err == nil:
		return 0, 0, fmt.Errorf("%w: %s row %s at %s failed %s, whose action is fail: ingestion stopped before applying it; correct the row in the source, or change the rule's action in %s",
			fault.ErrCheckFailed, failTable, failKey, change.Position{Seq: change.LSN(failSeq), Ord: failOrd}, failRules, w.contracts.For(t.schema.Schema, t.schema.Name).File)
	case !errors.Is(err, sql.ErrNoRows):
		return 0, 0, err
	}
	err = w.conn.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) FILTER (len(quarantine) > 0), count(*) FILTER (len(quarantine) = 0 AND len(warn) > 0) FROM %s`, verdict)).
		Scan(&quarantined, &warned)
	if err != nil || quarantined+warned == 0 {
		return 0, 0, err
	}
	_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT OR IGNORE INTO lakeflow.quarantine
		SELECT %s, to_json(struct_pack(%s)), r.op, list_concat(v.quarantine, v.warn),
			CASE WHEN len(v.quarantine) > 0 THEN 'quarantine' ELSE 'warn' END, to_json(r.after),
			r._cdc_seq, r._cdc_ord, r._commit_ts, now()
		FROM %s r JOIN %s v USING (kafka_partition, kafka_offset) WHERE len(v.quarantine) + len(v.warn) > 0`,
		literal(t.schema.ID()), strings.Join(key, ", "), rows, verdict))
	if err != nil {
		return 0, 0, fmt.Errorf("record the quarantine of %s: %w", t.schema.ID(), err)
	}
	if quarantined > 0 {
		_, err = w.conn.ExecContext(ctx, fmt.Sprintf(`DELETE FROM %s WHERE (kafka_partition, kafka_offset) IN
			(SELECT (kafka_partition, kafka_offset) FROM %s WHERE len(quarantine) > 0)`, rows, verdict))
	}
	return quarantined, warned, err
}

// verdictSQL judges the table's changes by its row rules: per change, the
// names of the rules it failed, by action. A rule fails when its check is
// false; NULL passes, as in a CHECK constraint.
func verdictSQL(t *table) string {
	lists := map[contracts.Action][]string{}
	for _, r := range t.rules {
		if r.Check != "" {
			lists[r.Action] = append(lists[r.Action], fmt.Sprintf("CASE WHEN (%s) IS FALSE THEN %s END", r.Check, literal(r.Name)))
		}
	}
	list := func(a contracts.Action) string {
		if len(lists[a]) == 0 {
			return "[]::VARCHAR[]"
		}
		return fmt.Sprintf("list_filter([%s], x -> x IS NOT NULL)", strings.Join(lists[a], ", "))
	}
	return fmt.Sprintf(`CREATE OR REPLACE TEMP TABLE %s AS
SELECT lakeflow_partition AS kafka_partition, lakeflow_offset AS kafka_offset, %s AS quarantine, %s AS warn, %s AS fail
FROM (SELECT unnest(after), kafka_partition AS lakeflow_partition, kafka_offset AS lakeflow_offset FROM %s WHERE op IN ('c', 'u', 'r'))`,
		verdictTable(t.id), list(contracts.Quarantine), list(contracts.Warn), list(contracts.Fail), rowsTable(t.id))
}

// referenceSQL adds the existence rule r of table t to t's verdicts: the
// row of u its columns name exists, not deleted, as of the change's
// position — in this batch's changes of u that passed u's quarantine
// rules (before it), else in silver as the batch found it. A change whose
// columns are NULL refers to nothing and passes.
func referenceSQL(t, u *table, r contracts.Rule, uTouched, uJudged bool) string {
	var evCols, refCols, on, silverOn, notNull []string
	for i, pair := range r.References.Columns {
		k := fmt.Sprintf("k%d", i)
		evCols = append(evCols, fmt.Sprintf("after.%s AS %s", ident(pair[0]), k))
		refCols = append(refCols, fmt.Sprintf("COALESCE(after, before).%s AS %s", ident(pair[1]), k))
		on = append(on, fmt.Sprintf("ref.%s = ev.%s", k, k))
		silverOn = append(silverOn, fmt.Sprintf("s.%s = ev.%s", ident(pair[1]), k))
		notNull = append(notNull, "ev."+k+" IS NOT NULL")
	}
	pos := "(_cdc_seq::HUGEINT * 4294967296 + _cdc_ord)"
	silver := fmt.Sprintf("EXISTS (SELECT 1 FROM silver.%s s WHERE %s AND NOT s._deleted)", ident(u.schema.Name), strings.Join(silverOn, " AND "))
	alive := silver
	from := fmt.Sprintf("(SELECT kafka_partition, kafka_offset, %s, %s AS pos FROM %s WHERE op IN ('c', 'u', 'r')) ev", strings.Join(evCols, ", "), pos, rowsTable(t.id))
	if uTouched {
		held := ""
		if uJudged {
			held = fmt.Sprintf(" AND (kafka_partition, kafka_offset) NOT IN (SELECT (kafka_partition, kafka_offset) FROM %s WHERE len(quarantine) > 0)", verdictTable(u.id))
		}
		from += fmt.Sprintf(` ASOF LEFT JOIN (SELECT %s, %s AS pos, op <> 'd' AS alive FROM %s WHERE op <> 't'%s) ref
			ON %s AND ev.pos > ref.pos`, strings.Join(refCols, ", "), pos, rowsTable(u.id), held, strings.Join(on, " AND "))
		alive = "coalesce(ref.alive, " + silver + ")"
	}
	field := "quarantine"
	if r.Action != contracts.Quarantine {
		field = string(r.Action)
	}
	return fmt.Sprintf(`UPDATE %[1]s AS v SET %[2]s = list_append(v.%[2]s, %[3]s)
FROM (SELECT ev.kafka_partition, ev.kafka_offset FROM %[4]s WHERE %[5]s AND NOT %[6]s) AS bad
WHERE v.kafka_partition = bad.kafka_partition AND v.kafka_offset = bad.kafka_offset`,
		verdictTable(t.id), field, literal(r.Name), from, strings.Join(notNull, " AND "), alive)
}
