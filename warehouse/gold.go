package warehouse

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/duckdb/duckdb-go/v2"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/sql/gold"
)

// A gold mart is refreshed by the partitions (grain values) batches
// touched: after silver is merged, in the batch's transaction, each
// touched table's changed rows (their images before and after the batch)
// give, through the mart's "touched by" SQL, the grain values whose rows
// may differ; they wait in lakeflow.gold_pending until the mart's cadence
// says refresh, which deletes those partitions and inserts them again
// from the mart's SELECT.

const goldTables = `
CREATE SCHEMA IF NOT EXISTS gold;
CREATE TABLE IF NOT EXISTS lakeflow.gold_marts (
	mart            VARCHAR PRIMARY KEY,
	file            VARCHAR NOT NULL,
	sql_hash        VARCHAR NOT NULL,
	grain           VARCHAR NOT NULL,
	refreshed_at    TIMESTAMPTZ,
	refreshed_batch BIGINT
);
CREATE TABLE IF NOT EXISTS lakeflow.gold_pending (
	mart  VARCHAR NOT NULL,
	grain VARCHAR NOT NULL
);`

// mart is a gold mart as the warehouse keeps it.
type mart struct {
	gold.Mart
	refresh config.Refresh
	// reads are the silver tables the SELECT reads.
	reads []string
	// active: the tables it reads exist, and so do its table and state.
	active bool
	// grainType is the DuckDB type of the grain column.
	grainType string
	refreshed time.Time
}

// SetMarts gives the warehouse its gold marts. Each is checked: its SQL
// must parse and read silver tables only, each with a "touched by" line.
// A mart that reads a table outside captured (silver table names) is
// skipped, with a log line. The others are set up as soon as the tables
// they read exist (now, or when the source first sends their schemas):
// their SQL is bound, and a mart that is new, or whose SQL changed, is
// built whole.
func (w *Warehouse) SetMarts(ctx context.Context, marts []gold.Mart, refresh map[string]config.Refresh, captured []string) error {
	w.marts = nil
	var problems []error
	for _, gm := range marts {
		m := &mart{Mart: gm, refresh: refresh[gm.Name]}
		reads, err := w.martReads(ctx, gm)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		m.reads = reads
		if missing := slices.DeleteFunc(slices.Clone(reads), func(t string) bool { return slices.Contains(captured, t) }); len(missing) > 0 {
			w.log.Info("gold mart skipped: it reads tables that are not captured", "mart", "gold."+gm.Name, "file", gm.File, "tables", missing)
			continue
		}
		if err := m.checkTouched(); err != nil {
			problems = append(problems, err)
			continue
		}
		w.marts = append(w.marts, m)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: gold marts: %w", fault.ErrConfig, errors.Join(problems...))
	}
	return w.activateMarts(ctx)
}

// martReads parses a mart's SQL and returns the silver tables it reads.
func (w *Warehouse) martReads(ctx context.Context, m gold.Mart) ([]string, error) {
	var raw string
	if err := w.conn.QueryRowContext(ctx, "SELECT json_serialize_sql("+literal(m.SQL)+")::VARCHAR").Scan(&raw); err != nil {
		return nil, err
	}
	var tree struct {
		Error    bool   `json:"error"`
		Message  string `json:"error_message"`
		Position string `json:"position"`
		Stmts    []any  `json:"statements"`
	}
	if err := json.Unmarshal([]byte(raw), &tree); err != nil {
		return nil, err
	}
	if tree.Error {
		pos, _ := strconv.Atoi(tree.Position)
		return nil, fmt.Errorf("%s:%d: %s", m.File, 1+strings.Count(m.SQL[:min(pos, len(m.SQL))], "\n"), tree.Message)
	}
	if len(tree.Stmts) != 1 {
		return nil, fmt.Errorf("%s: want one SELECT, found %d statements", m.File, len(tree.Stmts))
	}
	ctes := map[string]bool{}
	var reads []string
	var bad []string
	walk(tree.Stmts[0], func(node map[string]any) {
		if cm, ok := node["cte_map"].(map[string]any); ok {
			if entries, ok := cm["map"].([]any); ok {
				for _, e := range entries {
					if kv, ok := e.(map[string]any); ok {
						if k, ok := kv["key"].(string); ok {
							ctes[k] = true
						}
					}
				}
			}
		}
		if node["type"] != "BASE_TABLE" {
			return
		}
		schema, _ := node["schema_name"].(string)
		name, _ := node["table_name"].(string)
		switch {
		case schema == "silver":
			if !slices.Contains(reads, name) {
				reads = append(reads, name)
			}
		case schema == "" && (name == "lakeflow_refresh" || ctes[name]):
		default:
			bad = append(bad, strings.TrimPrefix(schema+"."+name, "."))
		}
	})
	if len(bad) > 0 {
		return nil, fmt.Errorf("%s: a mart reads silver tables only (and lakeflow_refresh); it reads %s", m.File, strings.Join(bad, ", "))
	}
	slices.Sort(reads)
	return reads, nil
}

// walk calls fn on every object of a decoded JSON tree.
func walk(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
		for _, c := range x {
			walk(c, fn)
		}
	case []any:
		for _, c := range x {
			walk(c, fn)
		}
	}
}

// checkTouched checks that every table the mart reads has a "touched by"
// line, and that every line names a table it reads.
func (m *mart) checkTouched() error {
	if m.Grain == gold.Full {
		return nil
	}
	var problems []string
	for _, t := range m.reads {
		if _, ok := m.Touched[t]; !ok {
			problems = append(problems, fmt.Sprintf("%s: it reads silver.%s but says nothing of how a change of it touches the mart: add \"-- touched by silver.%s: <expression>\" to the header", m.File, t, t))
		}
	}
	for t := range m.Touched {
		if !slices.Contains(m.reads, t) {
			problems = append(problems, fmt.Sprintf("%s:%d: touched by silver.%s, which the mart does not read", m.File, m.TouchedLine[t], t))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// activateMarts sets up the marts whose tables all exist now.
func (w *Warehouse) activateMarts(ctx context.Context) error {
	// Marts built now often ask the same of a table (the order day of
	// every order): each question is answered once. The answers, over all
	// of silver, are dropped once every mart is built.
	answers := map[string]string{}
	for _, m := range w.marts {
		if m.active || slices.ContainsFunc(m.reads, func(t string) bool { return w.silverTable(t) == nil }) {
			continue
		}
		if err := w.activate(ctx, m, answers); err != nil {
			return err
		}
	}
	return w.dropAnswers(ctx, answers)
}

// dropAnswers drops the temporary tables of touchOnce's answers.
func (w *Warehouse) dropAnswers(ctx context.Context, answers map[string]string) error {
	for _, tmp := range answers {
		if _, err := w.conn.ExecContext(ctx, "DROP TABLE IF EXISTS "+tmp); err != nil {
			return err
		}
	}
	return nil
}

// silverTable returns the registered table whose silver table is name.
func (w *Warehouse) silverTable(name string) *table {
	for _, t := range w.tables {
		if strings.EqualFold(t.schema.Name, name) {
			return t
		}
	}
	return nil
}

var lineRe = regexp.MustCompile(`LINE (\d+):`)

// bindError names the file and line of a DuckDB error about a mart's
// SQL: line, or, for the SELECT (line 0: DuckDB got the file whole, so
// its lines are the file's), the line DuckDB names.
func bindError(file string, line int, err error) error {
	msg := err.Error()
	if m := lineRe.FindStringSubmatch(msg); m != nil && line == 0 {
		n, _ := strconv.Atoi(m[1])
		line = n
	}
	if i := strings.Index(msg, "\n"); i > 0 {
		msg = msg[:i]
	}
	line = max(line, 1)
	return fmt.Errorf("%w: %s:%d: %s", fault.ErrConfig, file, line, msg)
}

// activate binds a mart's SQL, creates its table, and builds it whole if
// it is new or its SQL changed.
func (w *Warehouse) activate(ctx context.Context, m *mart, answers map[string]string) error {
	hash := sha256.Sum256([]byte(m.Grain + "\x00" + m.SQL))
	sum := hex.EncodeToString(hash[:8])
	m.grainType = "BOOLEAN" // a full mart's lakeflow_refresh is never read
	if m.Grain != gold.Full {
		for _, t := range m.reads {
			typ, err := w.touchedType(ctx, m, t)
			if err != nil {
				return err
			}
			if m.grainType != "BOOLEAN" && typ != m.grainType {
				return fmt.Errorf("%w: %s:%d: touched by silver.%s gives %s, another line %s", fault.ErrConfig, m.File, m.TouchedLine[t], t, typ, m.grainType)
			}
			m.grainType = typ
		}
	}
	if err := w.refreshTable(ctx, m.grainType); err != nil {
		return err
	}
	rows, err := w.conn.QueryContext(ctx, "DESCRIBE "+m.SQL)
	if err != nil {
		return bindError(m.File, 0, err)
	}
	grainCol := ""
	for rows.Next() {
		var name, typ string
		var null, key, def, extra sql.NullString
		if err := rows.Scan(&name, &typ, &null, &key, &def, &extra); err != nil {
			rows.Close()
			return err
		}
		if name == m.Grain {
			grainCol = typ
		}
	}
	rows.Close()
	if m.Grain != gold.Full && grainCol == "" {
		return fmt.Errorf("%w: %s: grain %s is not a column of the mart", fault.ErrConfig, m.File, m.Grain)
	}
	if m.Grain != gold.Full && grainCol != m.grainType {
		return fmt.Errorf("%w: %s: grain %s is %s, but the touched by lines give %s", fault.ErrConfig, m.File, m.Grain, grainCol, m.grainType)
	}
	var prev sql.NullString
	var refreshed sql.NullTime
	err = w.conn.QueryRowContext(ctx, "SELECT sql_hash, refreshed_at FROM lakeflow.gold_marts WHERE mart = ?", m.Name).Scan(&prev, &refreshed)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	m.refreshed = refreshed.Time
	m.active = true
	if prev.String == sum {
		return nil
	}
	w.log.Info("building gold mart", "mart", "gold."+m.Name, "file", m.File, "new", !prev.Valid)
	err = w.inTx(ctx, func(ctx context.Context) error {
		err := w.exec(ctx, []string{
			"DROP TABLE IF EXISTS " + m.table(),
			fmt.Sprintf("CREATE TABLE %s AS SELECT * FROM (%s) LIMIT 0", m.table(), m.SQL),
			"DELETE FROM lakeflow.gold_pending WHERE mart = " + literal(m.Name),
			fmt.Sprintf("INSERT OR REPLACE INTO lakeflow.gold_marts VALUES (%s, %s, %s, %s, NULL, NULL)",
				literal(m.Name), literal(m.File), literal(sum), literal(m.Grain)),
		})
		if err != nil {
			return err
		}
		// Every partition any row of silver touches (all of it, for a
		// full mart).
		var all []string
		if m.Grain != gold.Full {
			for _, t := range m.reads {
				tmp, err := w.touchOnce(ctx, m, t, "silver."+ident(t), answers)
				if err != nil {
					return err
				}
				all = append(all, tmp)
			}
		}
		return w.refreshMart(ctx, m, all)
	})
	if err == nil {
		m.refreshed = time.Now()
	}
	return err
}

// table is the mart's table.
func (m *mart) table() string { return "gold." + ident(m.Name) }

// touchedType binds the mart's touched by SQL of silver table t and
// returns the type it gives.
func (w *Warehouse) touchedType(ctx context.Context, m *mart, t string) (string, error) {
	if err := w.changedView(ctx, "silver."+ident(t)); err != nil {
		return "", err
	}
	rows, err := w.conn.QueryContext(ctx, "DESCRIBE "+m.Touched[t])
	if err != nil {
		return "", bindError(m.File, m.TouchedLine[t], err)
	}
	defer rows.Close()
	var types []string
	for rows.Next() {
		var name, typ string
		var null, key, def, extra sql.NullString
		if err := rows.Scan(&name, &typ, &null, &key, &def, &extra); err != nil {
			return "", err
		}
		types = append(types, typ)
	}
	if len(types) != 1 {
		return "", fmt.Errorf("%w: %s:%d: touched by silver.%s gives %d columns; want one, the grain", fault.ErrConfig, m.File, m.TouchedLine[t], t, len(types))
	}
	return types[0], rows.Err()
}

// changedView points the view changed, which touched by SQL reads, at
// relation rel.
func (w *Warehouse) changedView(ctx context.Context, rel string) error {
	_, err := w.conn.ExecContext(ctx, "CREATE OR REPLACE TEMP VIEW changed AS SELECT * FROM "+rel)
	return err
}

// refreshTable creates lakeflow_refresh, the grain values a refresh
// recomputes, with the given type.
func (w *Warehouse) refreshTable(ctx context.Context, typ string) error {
	_, err := w.conn.ExecContext(ctx, fmt.Sprintf("CREATE OR REPLACE TEMP TABLE lakeflow_refresh (grain %s)", typ))
	return err
}

// touchOnce answers the mart's touched by SQL of silver table t over the
// rows of rel (changed rows of t, or all of silver) in a temporary table
// of the grain values, which it returns; answers keeps the answers to
// the same question.
func (w *Warehouse) touchOnce(ctx context.Context, m *mart, t, rel string, answers map[string]string) (string, error) {
	q := rel + "\x00" + m.Touched[t]
	if tmp, ok := answers[q]; ok {
		return tmp, nil
	}
	tmp := fmt.Sprintf("lakeflow_touched_%d", len(answers))
	if err := w.changedView(ctx, rel); err != nil {
		return "", err
	}
	// Distinct values first, as the SELECT gives them: text for every
	// row, or a NOT NULL filter DuckDB pushes down (computing an
	// expression like created_at::DATE twice per row), costs more.
	_, err := w.conn.ExecContext(ctx, fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS SELECT DISTINCT g FROM (%s) AS touched(g)",
		tmp, m.Touched[t]))
	if err != nil {
		return "", fmt.Errorf("%s:%d: %w", m.File, m.TouchedLine[t], err)
	}
	answers[q] = tmp
	return tmp, nil
}

// pend keeps the touched values of tmp (a touchOnce answer) in
// lakeflow.gold_pending until the mart is refreshed.
func (w *Warehouse) pend(ctx context.Context, m *mart, tmp string) error {
	_, err := w.conn.ExecContext(ctx, fmt.Sprintf("INSERT INTO lakeflow.gold_pending SELECT %s, g::VARCHAR FROM %s WHERE g IS NOT NULL", literal(m.Name), tmp))
	return err
}

// refreshMart recomputes the mart's pending partitions and those the
// touched tables (touchOnce answers) hold (all of it, for a full mart)
// from silver and records that it did. It runs outside any batch's
// transaction: the mart holds the last committed batch.
func (w *Warehouse) refreshMart(ctx context.Context, m *mart, touched []string) error {
	if err := w.recompute(ctx, w.conn, m, touched); err != nil {
		return err
	}
	return markRefreshed(ctx, w.conn, []*mart{m}, w.batch)
}

// recompute recomputes, on conn, the mart's pending partitions and those
// the touched tables (touchOnce answers) hold (all of it, for a full
// mart) from silver; the temp table lakeflow_refresh holds them after.
func (w *Warehouse) recompute(ctx context.Context, conn *sql.Conn, m *mart, touched []string) error {
	t0 := time.Now()
	fresh := ""
	for _, tmp := range touched {
		fresh += " UNION ALL SELECT g::VARCHAR FROM " + tmp + " WHERE g IS NOT NULL"
	}
	defer func() { w.log.Debug("gold mart refreshed", "mart", m.Name, "took", time.Since(t0)) }()
	var stmts []string
	if m.Grain == gold.Full {
		stmts = []string{
			// Empty, for a full mart's SQL that names it: a batch's
			// scratch tables go at its commit.
			fmt.Sprintf("CREATE OR REPLACE TEMP TABLE lakeflow_refresh (grain %s)", m.grainType),
			"DELETE FROM " + m.table(),
			fmt.Sprintf("INSERT INTO %s SELECT * FROM (%s)", m.table(), m.SQL),
		}
	} else {
		stmts = []string{
			fmt.Sprintf("CREATE OR REPLACE TEMP TABLE lakeflow_refresh AS SELECT DISTINCT grain::%s AS grain FROM (SELECT grain FROM lakeflow.gold_pending WHERE mart = %s%s)",
				m.grainType, literal(m.Name), fresh),
			fmt.Sprintf("DELETE FROM %s WHERE %s IN (SELECT grain FROM lakeflow_refresh)", m.table(), ident(m.Grain)),
			// The SELECT reads lakeflow_refresh for speed; this filter
			// keeps a refresh to its partitions whatever the SELECT does.
			fmt.Sprintf("INSERT INTO %s SELECT * FROM (%s) WHERE %s IN (SELECT grain FROM lakeflow_refresh)", m.table(), m.SQL, ident(m.Grain)),
		}
	}
	if err := exec(ctx, conn, stmts...); err != nil {
		if refused(err) {
			// The mart's SQL bound at start: silver changed under it (a
			// column renamed or retyped) or holds what it cannot take.
			return fmt.Errorf("%w: gold.%s (%s) fails on silver as it is now: %w (change the mart's SQL: a mart whose SQL changed is rebuilt whole)", fault.ErrConfig, m.Name, m.File, err)
		}
		return fmt.Errorf("refresh gold.%s (%s): %w", m.Name, m.File, err)
	}
	return nil
}

// refused says whether DuckDB refused a statement for its SQL or for the
// data it read, which are its author's to change, and not for want of
// memory or disk or for an interrupt.
func refused(err error) bool {
	var de *duckdb.Error
	if !errors.As(err, &de) {
		return false
	}
	switch de.Type {
	case duckdb.ErrorTypeBinder, duckdb.ErrorTypeCatalog, duckdb.ErrorTypeParser, duckdb.ErrorTypeSyntax,
		duckdb.ErrorTypeConversion, duckdb.ErrorTypeOutOfRange, duckdb.ErrorTypeDivideByZero, duckdb.ErrorTypeInvalidInput,
		duckdb.ErrorTypeMismatchType, duckdb.ErrorTypeInvalidType, duckdb.ErrorTypeConstraint:
		return true
	}
	return false
}

// goldReads lists the tables of the batch that an active mart reads.
func (w *Warehouse) goldReads(order []*table) []*table {
	var out []*table
	for _, t := range order {
		if slices.ContainsFunc(w.marts, func(m *mart) bool { return m.active && slices.Contains(m.reads, t.schema.Name) }) {
			out = append(out, t)
		}
	}
	return out
}

// changedTable holds the changed rows of table id: silver's rows of the
// batch's keys before and after the merge.
func changedTable(id int) string { return fmt.Sprintf("lakeflow_changed_%d", id) }

// newestKeys is SQL joining silver.T, aliased s, to the keys of the
// batch's changes of t (newestTable: one row per key).
func newestKeys(t *table) string {
	var on []string
	for _, k := range t.schema.KeyColumns() {
		n := ident(t.schema.Columns[k].Name)
		on = append(on, fmt.Sprintf("s.%s = k.img.%s", n, n))
	}
	return fmt.Sprintf("SEMI JOIN %s k ON %s", newestTable(t.id), strings.Join(on, " AND "))
}

// changedBefore keeps the newest change per key of each table in tables
// (newestTable) for the merge and the after images, and silver's rows of
// the batch's keys (all its rows if the batch truncates it) before the
// merge.
func (w *Warehouse) changedBefore(ctx context.Context, tables []*table, rows map[*table]rowsInfo) error {
	for _, t := range tables {
		_, err := w.conn.ExecContext(ctx, fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS %s",
			newestTable(t.id), latestSQL(t.schema, t.id, rows[t], len(t.rules) > 0)))
		if err != nil {
			return err
		}
		silver := "silver." + ident(t.schema.Name)
		q := fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS SELECT s.* FROM %s s %s", changedTable(t.id), silver, newestKeys(t))
		if rows[t].truncates > 0 {
			q = fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS SELECT * FROM %s", changedTable(t.id), silver)
		}
		if _, err := w.conn.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// afterImagesSQL adds to the changed rows of t silver's rows of the
// batch's keys as the merge leaves them, from the batch itself rather
// than silver (a scan of silver per table and batch costs more): each
// key's newest change (newestTable), deleted or not. A change the merge
// did not take (older than silver's row) adds an image that only
// refreshes more; a deleted row's values are those it had before,
// already there.
func afterImagesSQL(t *table) string {
	cols := make([]string, len(t.schema.Columns))
	for i, c := range t.schema.Columns {
		cols[i] = columnValue(c, "s.img") + " AS " + ident(c.Name)
	}
	return fmt.Sprintf(`INSERT INTO %s BY NAME SELECT %s, s._cdc_seq, s._cdc_ord, s._commit_ts, s.del AS _deleted FROM %s s`,
		changedTable(t.id), strings.Join(cols, ", "), newestTable(t.id))
}

// refreshGold adds the batch's keys' rows after the merge to the changed
// rows (afterImagesSQL), records the partitions they touch for every active
// mart, and refreshes the marts whose cadence says so.
func (w *Warehouse) refreshGold(ctx context.Context, tables []*table, now time.Time) (refreshed []*mart, err error) {
	for _, t := range tables {
		if _, err := w.conn.ExecContext(ctx, afterImagesSQL(t)); err != nil {
			return nil, err
		}
	}
	// Marts often ask the same of a table (the order day of an order):
	// each question is answered once per batch.
	answers := map[string]string{}
	for _, m := range w.marts {
		if !m.active {
			continue
		}
		touched := false
		// A mart refreshed with this batch takes its touched values
		// straight from the batch's answers; the others keep them in
		// lakeflow.gold_pending until they are due.
		withBatch := m.everyBatch() && !w.deferGold
		var fresh []string
		for _, t := range tables {
			if !slices.Contains(m.reads, t.schema.Name) {
				continue
			}
			touched = true
			switch {
			case m.Grain == gold.Full && withBatch:
			case m.Grain == gold.Full:
				_, err = w.conn.ExecContext(ctx, "INSERT INTO lakeflow.gold_pending VALUES (?, 'true')", m.Name)
			default:
				var tmp string
				if tmp, err = w.touchOnce(ctx, m, t.schema.Name, changedTable(t.id), answers); err == nil && withBatch {
					fresh = append(fresh, tmp)
				} else if err == nil {
					err = w.pend(ctx, m, tmp)
				}
			}
			if err != nil {
				return nil, err
			}
		}
		switch {
		case m.refresh.Manual, m.everyBatch() && !withBatch:
			continue
		case m.refresh.Every > 0:
			if now.Sub(m.refreshed) < m.refresh.Every {
				continue
			}
		case !touched:
			continue
		}
		if err := w.recompute(ctx, w.conn, m, fresh); err != nil {
			return nil, err
		}
		refreshed = append(refreshed, m)
	}
	if len(refreshed) > 0 {
		if err := markRefreshed(ctx, w.conn, refreshed, w.batch+1); err != nil {
			return nil, err
		}
	}
	return refreshed, nil
}

// markRefreshed clears, on conn, the pending partitions of the marts and
// records when they were refreshed and the batch they hold, for all of
// them at once (two statements per mart and batch cost more).
func markRefreshed(ctx context.Context, conn *sql.Conn, marts []*mart, batch int64) error {
	in := martNames(marts)
	return exec(ctx, conn,
		fmt.Sprintf("DELETE FROM lakeflow.gold_pending WHERE mart IN (%s)", in),
		fmt.Sprintf("UPDATE lakeflow.gold_marts SET refreshed_at = now(), refreshed_batch = %d WHERE mart IN (%s)", batch, in))
}

// martNames lists the marts' names as SQL literals, for an IN (…).
func martNames(marts []*mart) string {
	names := make([]string, len(marts))
	for i, m := range marts {
		names[i] = literal(m.Name)
	}
	return strings.Join(names, ", ")
}

// RefreshDue refreshes the marts refreshed at an interval whose interval
// has passed (all of them when drained: the run ends) and that have
// partitions waiting. The consumer calls it while idle, so a mart does
// not wait for the next batch.
func (w *Warehouse) RefreshDue(ctx context.Context, drained bool) error {
	want := func(m *mart) bool {
		return m.refresh.Every > 0 && (drained || time.Since(m.refreshed) >= m.refresh.Every)
	}
	if !slices.ContainsFunc(w.marts, func(m *mart) bool { return m.active && want(m) }) {
		return nil // no statement while idle when no mart is due
	}
	due, err := w.waiting(ctx, w.conn, want)
	if err != nil {
		return err
	}
	return w.refreshAll(ctx, due)
}

// DeferGold makes the batches leave the partitions they touch of the marts
// refreshed with every batch in lakeflow.gold_pending, as they do for
// those refreshed at an interval, until the next copy's Publish or
// RefreshDeferred refreshes them. lakeflow run's live warehouse is private:
// readers open only its copies, and each still holds every mart as of
// its silver. A mart whose partitions grow (a day's orders, all day)
// costs a batch more with every batch; refreshed once per copy, it costs
// that once per copy.
func (w *Warehouse) DeferGold() { w.deferGold = true }

// RefreshDeferred refreshes the marts refreshed with every batch that
// have partitions waiting (DeferGold, or a run that stopped before its
// last copy), and says how long that took. It runs between batches, and
// not while a copy is being published (Copy.Publish refreshes the same
// marts beside the batches: DuckDB would refuse one of the two).
func (w *Warehouse) RefreshDeferred(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	due, err := w.waiting(ctx, w.conn, (*mart).everyBatch)
	if err != nil || len(due) == 0 {
		return 0, err
	}
	if err := w.refreshAll(ctx, due); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// everyBatch says the mart's cadence is "batch".
func (m *mart) everyBatch() bool { return m.refresh == (config.Refresh{}) }

// waiting returns the active marts that want says and that have
// partitions waiting in lakeflow.gold_pending, as conn sees it.
func (w *Warehouse) waiting(ctx context.Context, conn *sql.Conn, want func(*mart) bool) ([]*mart, error) {
	rows, err := conn.QueryContext(ctx, "SELECT DISTINCT mart FROM lakeflow.gold_pending")
	if err != nil {
		return nil, err
	}
	pending := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, err
		}
		pending[name] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	var out []*mart
	for _, m := range w.marts {
		if m.active && pending[m.Name] && want(m) {
			out = append(out, m)
		}
	}
	return out, nil
}

// refreshAll refreshes the marts from their waiting partitions, in one
// transaction.
func (w *Warehouse) refreshAll(ctx context.Context, marts []*mart) error {
	if len(marts) == 0 {
		return nil
	}
	err := w.inTx(ctx, func(ctx context.Context) error {
		for _, m := range marts {
			if err := w.recompute(ctx, w.conn, m, nil); err != nil {
				return err
			}
		}
		return markRefreshed(ctx, w.conn, marts, w.batch)
	})
	if err != nil {
		return err
	}
	for _, m := range marts {
		m.refreshed = time.Now()
	}
	return nil
}
