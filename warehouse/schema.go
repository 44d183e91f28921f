package warehouse

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// Schema is a table schema as the schema topic records it.
type Schema struct {
	Topic string
	Table *change.Table
}

// ApplySchemas creates silver tables for new source schemas and evolves
// existing ones (columns added, types widened), in one transaction that
// also records pos, the schema topic position after these records, and
// state, the source's state (nil: unchanged). Any other change is
// refused: applying it would rewrite history.
func (w *Warehouse) ApplySchemas(ctx context.Context, schemas []Schema, schemaTopic string, pos TopicPosition, state *change.SourceState) error {
	// DuckDB refuses to commit a transaction that alters a table after
	// updating it: every ALTER runs before every UPDATE.
	var stmts, fills []string
	latest := map[string]Schema{}
	var order []string
	for _, s := range schemas {
		id := s.Table.ID()
		var prev *change.Table
		if l, ok := latest[id]; ok {
			prev = l.Table
		} else if t := w.tables[id]; t != nil {
			prev = t.schema
		} else {
			order = append(order, id)
		}
		next := carryFills(prev, s.Table)
		ddl, dml, err := evolve(prev, next)
		if err != nil {
			return err
		}
		stmts = append(stmts, ddl...)
		fills = append(fills, dml...)
		latest[id] = Schema{Topic: s.Topic, Table: next}
	}
	stmts = append(stmts, fills...)
	for id, s := range latest {
		schemaJSON, err := json.Marshal(s.Table)
		if err != nil {
			return err
		}
		stmts = append(stmts, fmt.Sprintf("INSERT OR REPLACE INTO lakeflow.tables VALUES (%s, %s, %s, %s, now())",
			literal(id), literal(s.Topic), literal("silver."+s.Table.Name), literal(string(schemaJSON))))
	}
	if state != nil {
		stateJSON, err := json.Marshal(state)
		if err != nil {
			return err
		}
		stmts = append(stmts, fmt.Sprintf("INSERT OR REPLACE INTO lakeflow.source_state VALUES (1, %s, now())", literal(string(stateJSON))))
	}
	err := w.inTx(ctx, func(ctx context.Context) error {
		if err := w.exec(ctx, stmts); err != nil {
			return err
		}
		return w.saveOffsets(ctx, map[string]TopicPosition{schemaTopic: pos})
	})
	if err != nil {
		return fmt.Errorf("create or evolve silver tables: %w", err)
	}
	for _, s := range latest {
		prev := w.tables[s.Table.ID()]
		if prev != nil && prev.topic != s.Topic {
			delete(w.byTopic, prev.topic)
		}
		t := w.register(s.Topic, s.Table)
		switch {
		case prev == nil:
			if err := w.scanLake(t); err != nil {
				return err
			}
		case prev.topic != s.Topic:
			// A new topic for a table the lake holds (kafka.topic_prefix
			// changed): its offsets say nothing of what the lake has.
			if err := w.LogReset(ctx, t.topic); err != nil {
				return err
			}
		}
	}
	return nil
}

// Schemas returns the schema of every table the warehouse holds.
func (w *Warehouse) Schemas() map[string]*change.Table {
	out := make(map[string]*change.Table, len(w.tables))
	for id, t := range w.tables {
		out[id] = t.schema
	}
	return out
}

// SourceState returns the copy of the source's state the warehouse
// keeps, or nil.
func (w *Warehouse) SourceState(ctx context.Context) (*change.SourceState, error) {
	var raw string
	err := w.conn.QueryRowContext(ctx, "SELECT state::VARCHAR FROM lakeflow.source_state WHERE id = 1").Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s change.SourceState
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return nil, fmt.Errorf("lakeflow.source_state: %w", err)
	}
	return &s, nil
}

// AppliedEnd is the end LSN of the last consistent batch (0: none).
func (w *Warehouse) AppliedEnd(ctx context.Context) (change.LSN, error) {
	var end sql.NullInt64
	err := w.conn.QueryRowContext(ctx, "SELECT end_lsn::BIGINT FROM lakeflow.batches WHERE consistent ORDER BY batch DESC LIMIT 1").Scan(&end)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	return change.LSN(end.Int64), nil
}

// carryFills keeps the fill values next's columns had in prev: a schema
// recorded after a restart of the source (or after its Kafka data was
// lost) no longer knows when a column was added.
func carryFills(prev, next *change.Table) *change.Table {
	if prev == nil {
		return next
	}
	out := *next
	out.Columns = append([]change.Column(nil), next.Columns...)
	for i, c := range out.Columns {
		if j := prev.Column(c.Name); j >= 0 && !c.Fill.Set() {
			out.Columns[i].Fill = prev.Columns[j].Fill
		}
	}
	return &out
}

// evolve returns the DDL that takes silver from prev (nil: no table yet)
// to next, and the updates that give rows older than an added column its
// default.
func evolve(prev, next *change.Table) (ddl, dml []string, err error) {
	if prev == nil {
		return []string{createTable(next)}, nil, nil
	}
	ev, err := prev.CheckEvolution(next)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", fault.ErrSchemaBreak, err)
	}
	silver := "silver." + ident(next.Name)
	rebuild := false
	for _, wc := range ev.Widened {
		if wc.Column.Key {
			rebuild = true // DuckDB cannot retype a key column in place
			continue
		}
		if to := duckType(wc.Column.Type).duck; to != duckType(wc.From).duck {
			ddl = append(ddl, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE %s", silver, ident(wc.Column.Name), to))
		}
	}
	if rebuild {
		ddl = append(ddl, rebuildTable(prev, next)...)
	}
	for _, c := range ev.Added {
		ddl = append(ddl, fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", silver, ident(c.Name), duckType(c.Type).duck))
		if c.Fill.Set() {
			// The rows silver has are older than the column: PostgreSQL
			// gave them its default.
			dml = append(dml, fmt.Sprintf("UPDATE %s AS s SET %s = %s WHERE %s", silver, ident(c.Name), fillValue(c), positionBefore("s", c.Fill.Before)))
		}
	}
	return ddl, dml, nil
}

// rebuildTable copies silver into a table with next's types for prev's
// columns, in the same column order: DuckDB cannot change the type of a
// key column in place.
func rebuildTable(prev, next *change.Table) []string {
	silver := "silver." + ident(next.Name)
	tmpName := next.Name + "__lakeflow_rebuild"
	var casts, keys []string
	for _, old := range prev.Columns {
		c := next.Columns[next.Column(old.Name)]
		casts = append(casts, fmt.Sprintf("CAST(%s AS %s) AS %s", ident(c.Name), duckType(c.Type).duck, ident(c.Name)))
		if c.Key {
			keys = append(keys, ident(c.Name))
		}
	}
	stmts := []string{
		fmt.Sprintf("CREATE TABLE silver.%s AS SELECT * REPLACE (%s) FROM %s", ident(tmpName), strings.Join(casts, ", "), silver),
		"DROP TABLE " + silver,
		fmt.Sprintf("ALTER TABLE silver.%s RENAME TO %s", ident(tmpName), ident(next.Name)),
	}
	if !keyHasInterval(next) {
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ADD PRIMARY KEY (%s)", silver, strings.Join(keys, ", ")))
	}
	return stmts
}

// inTx runs fn in one transaction: committed if fn succeeds, rolled back
// otherwise. Once begun, the transaction is finished whatever happens to
// ctx (a Ctrl-C applies the batch in flight): COMMIT and ROLLBACK never
// run under a cancelled context, which would leave the connection inside
// an open transaction.
func (w *Warehouse) inTx(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), txTimeout)
	defer cancel()
	if _, err := w.conn.ExecContext(ctx, "BEGIN TRANSACTION"); err != nil {
		return err
	}
	if err := fn(ctx); err != nil {
		_, rbErr := w.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return errors.Join(err, rbErr)
	}
	if w.beforeCommit != nil {
		w.beforeCommit()
	}
	if _, err := w.conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// txTimeout bounds one warehouse transaction.
const txTimeout = 10 * time.Minute

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
func (w *Warehouse) register(topic string, t *change.Table) *table {
	id := len(w.tables)
	if prev, ok := w.tables[t.ID()]; ok {
		id = prev.id
	}
	tb := &table{id: id, topic: topic, schema: t, parse: parseSQL(id, topic, t), apply: applySQL(t, id, false), applyKeyOnly: applySQL(t, id, true),
		rules: w.rulesFor(t)}
	w.tables[t.ID()] = tb
	w.byTopic[topic] = tb
	return tb
}
