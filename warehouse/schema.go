package warehouse

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// Schema is a table schema as the schema topic records it.
type Schema struct {
	Topic string
	Table *change.Table
}

// ApplySchemas creates silver tables for new source schemas and evolves
// existing ones (columns added, types widened), in one transaction that
// also records pos, the schema topic position after these records,
// state, the source's state (nil: unchanged), and dead, records of the
// schema topic that are not lakeflow's (as dead letters). Any other
// change is refused: applying it would rewrite history.
func (w *Warehouse) ApplySchemas(ctx context.Context, schemas []Schema, schemaTopic string, pos TopicPosition, state *change.SourceState, dead []DeadLetter) error {
	// DuckDB refuses to commit a transaction that alters a table after
	// updating it: every ALTER runs before every UPDATE. A version's
	// checks run right before its own statements, on silver as the
	// versions before it left it (a table or column they created).
	var checks []check
	var checkAt []int // checks[i] runs before stmts[checkAt[i]]
	var stmts, records []string
	var fills []*fill                  // in order
	tableFills := map[string][]*fill{} // by source table
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
		p, err := evolve(prev, next, false)
		if err != nil {
			return err
		}
		// Fills run after every ALTER: the table's pending ones take the
		// name their column has once this version's renames are done.
		renamed := map[string]string{}
		for _, r := range p.renamed {
			renamed[r.From] = r.To
		}
		for _, f := range tableFills[id] {
			if to, ok := renamed[f.col]; ok {
				f.col = to
			}
		}
		add := func(p plan) {
			for _, c := range p.checks {
				checks, checkAt = append(checks, c), append(checkAt, len(stmts))
			}
			stmts = append(stmts, p.ddl...)
			for _, f := range p.fills {
				fills = append(fills, &f)
				tableFills[id] = append(tableFills[id], &f)
			}
		}
		add(p)
		if w.keepsHistory(next) {
			h, err := evolve(prev, next, true)
			if err != nil {
				return err
			}
			add(h)
		}
		history, err := json.Marshal(next)
		if err != nil {
			return err
		}
		records = append(records, fmt.Sprintf("INSERT OR REPLACE INTO lakeflow.schema_history VALUES (%s, %d, %d, %s, %s, now())",
			literal(id), uint64(next.Since.Seq), next.Since.Ord, literal(string(history)), literal(p.summary)))
		latest[id] = Schema{Topic: s.Topic, Table: next}
	}
	for _, f := range fills {
		stmts = append(stmts, fmt.Sprintf("UPDATE %s AS s SET %s = %s WHERE %s", f.table, ident(f.col), f.value, f.where))
	}
	stmts = append(stmts, records...)
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
	var deadFiles []lake.File
	err := w.inTx(ctx, func(ctx context.Context) error {
		done := 0
		for i, c := range checks {
			if err := w.exec(ctx, stmts[done:checkAt[i]]); err != nil {
				return err
			}
			done = checkAt[i]
			if err := c.run(ctx, w); err != nil {
				return err
			}
		}
		if err := w.exec(ctx, stmts[done:]); err != nil {
			return err
		}
		positions := map[string]TopicPosition{schemaTopic: pos}
		var err error
		deadFiles, err = w.recordDead(ctx, dead, positions)
		if err != nil {
			return err
		}
		return w.saveOffsets(ctx, positions)
	})
	if err != nil {
		w.removeStaging(ctx, deadFiles)
		return fmt.Errorf("create or evolve silver tables: %w", err)
	}
	if err := w.lake.Publish(deadFiles); err != nil {
		return fmt.Errorf("%w: %w: %w", fault.ErrEnvironment, ErrUnpublished, err)
	}
	for _, s := range latest {
		prev := w.tables[s.Table.ID()]
		if prev != nil && prev.topic != s.Topic {
			delete(w.byTopic, prev.topic)
		}
		t := w.register(s.Topic, s.Table)
		if !w.olderVersions {
			if err := w.checkRules(ctx, t); err != nil {
				return err
			}
		}
	}
	return w.activateMarts(ctx)
}

// ApplyVersions creates the tables of schemas, which hold each table's
// versions in the order they took effect (a lake's, LakeState): one
// version at a time, as the stream met them, so each evolves the table
// the one before made. (No Kafka position is recorded.)
//
// Every version was accepted when the stream met it (its contract then
// decided; the lake has no version it refused), and the lake may lack
// the versions in between (changes from before a schema change written
// under a later one): what changed since the version before is applied.
//
// The contracts' rules are checked against the newest versions alone,
// under which the replay judges every change: an older one may lack a
// column today's contract names (renamed since, and renamed_from dropped
// from the contract, or renamed twice).
func (w *Warehouse) ApplyVersions(ctx context.Context, schemas []Schema, schemaTopic string) error {
	w.olderVersions = true
	defer func() { w.olderVersions = false }()
	for _, s := range schemas {
		t := *s.Table
		t.Accepted = true
		s.Table = &t
		if err := w.ApplySchemas(ctx, []Schema{s}, schemaTopic, TopicPosition{Next: map[int32]int64{}}, nil, nil); err != nil {
			return err
		}
	}
	for _, t := range w.byTopic {
		if err := w.checkRules(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// Schemas returns a copy of the schema of every table the warehouse
// holds: the caller may hand them to another goroutine (the source
// resumes from them when Kafka lost its schemas) while batches read the
// warehouse's own.
func (w *Warehouse) Schemas() map[string]*change.Table {
	out := make(map[string]*change.Table, len(w.tables))
	for id, t := range w.tables {
		out[id] = t.schema.Clone()
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

// plan is how silver follows a schema change: checks that must hold
// first, DDL, then updates (fills), and a summary for the schema history.
type plan struct {
	checks  []check
	ddl     []string
	fills   []fill
	renamed []change.Renamed // by the DDL, dropped columns moved aside included
	summary string
}

// fill gives column col of table (silver's or its history) the value
// value in the rows that predate it (where says which).
type fill struct {
	table, col, value, where string
}

// check is a query that must count no rows, with what to say otherwise.
type check struct {
	count, example string
	refusal        string
}

func (c check) run(ctx context.Context, w *Warehouse) error {
	var n int64
	if err := w.conn.QueryRowContext(ctx, c.count).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	var example string
	w.conn.QueryRowContext(ctx, c.example).Scan(&example)
	return fmt.Errorf("%w: %s: %d stored values do not convert (for example %q); correct them in the source (they arrive as changes) or accept another type in the contract",
		fault.ErrSchemaBreak, c.refusal, n, example)
}

// evolve plans how silver (or, with history, the table's history) goes
// from prev (nil: no table yet) to next. Without the contract's
// acceptance (next.Accepted) only new columns and widened types evolve.
// With it, a renamed column is renamed, a dropped one is kept (retired:
// NULL for changes from then on), and a retyped one converted where every
// stored value converts. A new key is refused.
func evolve(prev, next *change.Table, history bool) (plan, error) {
	var p plan
	if prev == nil {
		p.ddl = []string{createTable(next)}
		if history {
			p.ddl = []string{createHistory(next)}
		}
		p.summary = "created"
		return p, nil
	}
	silver := "silver." + ident(next.Name)
	if history {
		silver = historyName(next)
	}
	var summary []string
	renames := renamesSince(prev, next)
	diffRenames := maps.Clone(renames)
	var applied []change.Renamed
	// keep moves the dropped column from, which silver keeps (and changes
	// from before its drop carry its values), to a name of its own when
	// another column takes its name.
	keep := func(from string) string {
		kept := keptName(prev, next, from)
		p.ddl = append(p.ddl, fmt.Sprintf("ALTER TABLE %s RENAME COLUMN %s TO %s", silver, ident(from), ident(kept)))
		summary = append(summary, "kept the dropped "+from+" as "+kept)
		applied = append(applied, change.Renamed{From: from, To: kept})
		return kept
	}
	sources := slices.Collect(maps.Values(renames))
	for _, to := range slices.Sorted(maps.Keys(renames)) {
		// Renamed to the name of a column dropped before, or dropped now
		// (PostgreSQL's online retype: add b_new, fill it, drop b, rename
		// b_new to b): the dropped one moves first.
		from := renames[to]
		if prev.Column(from) < 0 {
			continue
		}
		named := func(c change.Column) bool { return strings.EqualFold(c.Name, to) }
		moved := *prev
		if i := slices.IndexFunc(prev.Retired, named); i >= 0 {
			moved.Retired = slices.Clone(prev.Retired)
			moved.Retired[i].Name = keep(prev.Retired[i].Name)
		} else if i := slices.IndexFunc(prev.Columns, named); i >= 0 && !strings.EqualFold(from, to) && !slices.Contains(sources, prev.Columns[i].Name) {
			moved.Columns = slices.Clone(prev.Columns)
			moved.Columns[i].Name = keep(prev.Columns[i].Name)
		} else {
			continue
		}
		prev = &moved
	}
	for _, to := range slices.Sorted(maps.Keys(renames)) {
		// Renamed, then dropped, or renamed with its old name given to a
		// new column: renamed here, before the comparison (which matches
		// columns by name), and retired or added below.
		if from := renames[to]; (retired(next, to) >= 0 || next.Column(from) >= 0) && prev.Column(from) >= 0 {
			p.ddl = append(p.ddl, fmt.Sprintf("ALTER TABLE %s RENAME COLUMN %s TO %s", silver, ident(from), ident(to)))
			summary = append(summary, "renamed "+from+" to "+to)
			renamed := *prev
			renamed.Columns = slices.Clone(prev.Columns)
			renamed.Columns[prev.Column(from)].Name = to
			prev = &renamed
			delete(diffRenames, to)
			applied = append(applied, change.Renamed{From: from, To: to})
		}
	}
	d := prev.Diff(next, diffRenames)
	applied = append(applied, d.Renamed...)
	if brk := d.Breaking(prev, next); d.Key != nil || (len(brk) > 0 && !next.Accepted) {
		return p, fmt.Errorf("%w: %v", fault.ErrSchemaBreak, &brk[0])
	}
	for _, r := range d.Renamed {
		p.ddl = append(p.ddl, fmt.Sprintf("ALTER TABLE %s RENAME COLUMN %s TO %s", silver, ident(r.From), ident(r.To)))
		summary = append(summary, "renamed "+r.From+" to "+r.To)
	}
	rebuild := false
	for _, r := range append(append(d.Widened, d.Narrowed...), d.Retyped...) {
		to, from := duckType(r.Column.Type).duck, duckType(r.From).duck
		summary = append(summary, r.Column.Name+" "+r.From.Name+" → "+r.Column.Type.Name)
		if to == from {
			continue
		}
		col := ident(r.Column.Name)
		p.checks = append(p.checks, check{
			count:   fmt.Sprintf("SELECT count(*) FROM %s WHERE %s IS NOT NULL AND TRY_CAST(%s AS %s) IS NULL", silver, col, col, to),
			example: fmt.Sprintf("SELECT %s::VARCHAR FROM %s WHERE %s IS NOT NULL AND TRY_CAST(%s AS %s) IS NULL LIMIT 1", col, silver, col, col, to),
			refusal: fmt.Sprintf("column %s of %s cannot become %s in silver", r.Column.Name, silver, to),
		})
		if r.Column.Key && !history {
			rebuild = true // DuckDB cannot retype a key column in place
			continue
		}
		p.ddl = append(p.ddl, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE %s", silver, col, to))
	}
	if rebuild {
		p.ddl = append(p.ddl, rebuildTable(next, d.Added)...)
	}
	if history {
		// The history's columns follow silver's; what silver records of
		// the change (retired columns, the summary) is silver's plan.
		next = &change.Table{Columns: next.Columns, Retired: append([]change.Column(nil), prev.Retired...)}
	}
	next.Retired = append([]change.Column(nil), prev.Retired...)
	for _, c := range d.Dropped {
		c.Dropped = next.Since
		next.Retired = append(next.Retired, c)
		summary = append(summary, "dropped "+c.Name+" (kept, NULL from here on)")
	}
	var added []change.Column
	for _, c := range d.Added {
		if i := slices.IndexFunc(next.Retired, func(r change.Column) bool { return strings.EqualFold(r.Name, c.Name) }); i >= 0 {
			// Dropped before and added again: a new column (the source's
			// rows hold NULL or its default in it).
			next.Retired[i].Name = keep(next.Retired[i].Name)
		}
		p.ddl = append(p.ddl, fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", silver, ident(c.Name), duckType(c.Type).duck))
		added = append(added, c)
		summary = append(summary, "added "+c.Name+" "+c.Type.Name)
		if c.Fill.Set() {
			// The rows silver has are older than the column: PostgreSQL
			// gave them its default.
			p.fills = append(p.fills, fill{table: silver, col: c.Name, value: fillValue(c), where: positionBefore("s", c.Fill.Before)})
		}
	}
	if !history {
		next.Renames = renames
		if next.Formerly == nil {
			next.Formerly = formerly(prev, next, applied, added)
		}
		if next.Reals == nil {
			next.Reals = reals(prev, next, applied, d.Widened)
		}
	}
	p.renamed = applied
	p.summary = strings.Join(summary, "; ")
	return p, nil
}

// keptName is a name for the dropped column col when another takes its
// name: col_dropped, or col_dropped_2 and on where a column of prev or
// next has that name (DuckDB's names ignore case). (next's own dropped
// columns, if it has them, are prev's: a rebuild's versions hold them.)
func keptName(prev, next *change.Table, col string) string {
	taken := func(name string) bool {
		for _, c := range slices.Concat(prev.Columns, prev.Retired, next.Columns) {
			if strings.EqualFold(c.Name, name) {
				return true
			}
		}
		return false
	}
	name := col + "_dropped"
	for n := 2; taken(name); n++ {
		name = fmt.Sprintf("%s_dropped_%d", col, n)
	}
	return name
}

func retired(t *change.Table, name string) int {
	for i, c := range t.Retired {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// rebuildTable copies silver into a table with next's types, in the same
// column order (retired columns included): DuckDB cannot change the type
// of a column in a primary key, which silver tables of warehouses made
// before 2026-12-03 have (the copy has none). Keys that become one under
// the new type (text '01' and '1' as integers, a deleted row beside a
// live one: the source's retype saw only the live) keep one row: the live
// one, else the newest, as the source has it.
func rebuildTable(next *change.Table, added []change.Column) []string {
	silver := "silver." + ident(next.Name)
	tmpName := next.Name + "__lakeflow_rebuild"
	var casts, keys []string
	for _, c := range next.Columns {
		if slices.ContainsFunc(added, func(a change.Column) bool { return a.Name == c.Name }) {
			continue // added after the rebuild
		}
		cast := fmt.Sprintf("CAST(%s AS %s)", ident(c.Name), duckType(c.Type).duck)
		casts = append(casts, cast+" AS "+ident(c.Name))
		if c.Key {
			keys = append(keys, cast)
		}
	}
	stmts := []string{
		fmt.Sprintf(`CREATE TABLE silver.%s AS SELECT * REPLACE (%s) FROM %s
			QUALIFY row_number() OVER (PARTITION BY %s ORDER BY _deleted, _cdc_seq DESC, _cdc_ord DESC) = 1`,
			ident(tmpName), strings.Join(casts, ", "), silver, strings.Join(keys, ", ")),
		"DROP TABLE " + silver,
		fmt.Sprintf("ALTER TABLE silver.%s RENAME TO %s", ident(tmpName), ident(next.Name)),
	}
	for _, m := range change.MetaColumns {
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s SET NOT NULL", silver, m))
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
	return exec(ctx, w.conn, stmts...)
}

// createTable creates silver's table of t, with the columns the source
// dropped that silver keeps (a warehouse rebuilt from another's schemas
// starts from the newest). The key gets no PRIMARY KEY constraint: the
// merge keeps one row per key, and the constraint's index cost every
// merge a fifth to a third of its time and a 5,000,000-change backlog
// 70 MiB.
func createTable(t *change.Table) string {
	var cols []string
	for _, c := range imageColumns(t) {
		cols = append(cols, ident(c.Name)+" "+duckType(c.Type).duck)
	}
	cols = append(cols,
		"_cdc_seq UBIGINT NOT NULL", "_cdc_ord UINTEGER NOT NULL",
		"_commit_ts TIMESTAMPTZ NOT NULL", "_deleted BOOLEAN NOT NULL")
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS silver.%s (%s)", ident(t.Name), strings.Join(cols, ", "))
}

// renamesSince is what next renamed since prev (new name → old name):
// the renames the source recorded with next, and those next's former
// names tell (of its columns, and of those dropped since) when versions
// in between are missing (a rebuild from the lake knows only the
// versions its files were written under, and changes from before a
// rename may have been written under a later one).
func renamesSince(prev, next *change.Table) map[string]string {
	out := maps.Clone(next.Renames)
	for _, c := range imageColumns(next) {
		for _, f := range formerNames(next, c.Name) {
			if !prev.Since.Less(f.Before) {
				continue // the name had ended when prev took effect
			}
			// (A column prev has under c's name is another one, since
			// dropped or renamed away.)
			if prev.Column(f.Name) >= 0 {
				if out == nil {
					out = map[string]string{}
				}
				out[c.Name] = f.Name
			}
			break
		}
	}
	return out
}

// formerNames are the former names of column col of t, oldest first.
func formerNames(t *change.Table, col string) []change.Former {
	var out []change.Former
	for _, f := range t.Formerly {
		if f.Column == col {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b change.Former) int {
		switch {
		case a.Before.Less(b.Before):
			return -1
		case b.Before.Less(a.Before):
			return 1
		}
		return 0
	})
	return out
}

// formerly carries prev's former column names over to next, through
// the renames between them (a dropped column keeps its own: silver keeps
// the column, and changes from before the drop its values), and adds the
// names those renames replaced, which changes before next.Since carry,
// and, for a column added under a name another column had, that it did
// not exist before.
func formerly(prev, next *change.Table, renamed []change.Renamed, added []change.Column) []change.Former {
	var out []change.Former
	for _, f := range prev.Formerly {
		for _, r := range renamed {
			if r.From == f.Column {
				f.Column = r.To
				break
			}
		}
		if next.Column(f.Column) >= 0 || retired(next, f.Column) >= 0 {
			out = append(out, f)
		}
	}
	for _, r := range renamed {
		out = append(out, change.Former{Column: r.To, Name: r.From, Before: next.Since})
	}
	for _, c := range added {
		// A new column under a name another column had: changes from
		// before carry that column's values under it.
		if slices.ContainsFunc(out, func(f change.Former) bool { return strings.EqualFold(f.Name, c.Name) }) {
			out = append(out, change.Former{Column: c.Name, Before: next.Since})
		}
	}
	return out
}

// reals carries prev's widened real columns over to next, through the
// renames between them, and adds those widened from real to double
// precision at next.Since.
func reals(prev, next *change.Table, renamed []change.Renamed, widened []change.Retyped) []change.Former {
	var out []change.Former
	for _, f := range prev.Reals {
		for _, r := range renamed {
			if r.From == f.Column {
				f.Column = r.To
				break
			}
		}
		if next.Column(f.Column) >= 0 {
			out = append(out, f)
		}
	}
	for _, w := range widened {
		if w.From.Kind == change.KindFloat4 && w.Column.Type.Kind == change.KindFloat8 && w.From.Dims == 0 {
			out = append(out, change.Former{Column: w.Column.Name, Before: next.Since})
		}
	}
	return out
}

// register remembers a table and prepares the SQL that decodes its events.
func (w *Warehouse) register(topic string, t *change.Table) *table {
	id := len(w.tables)
	if prev, ok := w.tables[t.ID()]; ok {
		id = prev.id
	}
	rules := w.rulesFor(t)
	tb := &table{id: id, topic: topic, schema: t, parse: parseSQL(id, topic, t), flat: newFlatDecoder(id, topic, t), rules: rules, history: w.keepsHistory(t)}
	tb.pending = w.contracts.For(t.Schema, t.Name).Pending(t)
	w.tables[t.ID()] = tb
	w.byTopic[topic] = tb
	return tb
}
