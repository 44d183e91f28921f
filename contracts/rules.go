package contracts

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	_ "github.com/duckdb/duckdb-go/v2" // DuckDB parses and binds the rules

	"github.com/lakeflow/lakeflow/internal/fault"
)

// environmental are functions DuckDB calls consistent that still answer
// from outside the row (the process's environment and settings).
var environmental = map[string]bool{"getenv": true, "current_setting": true}

// checker binds rules: one in-memory DuckDB for every contract loaded.
type checker struct {
	db  *sql.DB
	fns functions
}

func newChecker() (*checker, error) {
	db, err := sql.Open("duckdb", "")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return &checker{db: db, fns: functions{known: map[string]bool{}, aggregate: map[string]bool{}, unstable: map[string]bool{}}}, nil
}

func (ck *checker) close() error { return ck.db.Close() }

// checkRules checks every check expression of c: one SQL boolean
// expression over a row of the table's columns, without subqueries,
// aggregates, window functions or volatile functions. DuckDB parses and
// binds it, so an unknown column, a type error or a syntax error is found
// here, not in the middle of a batch. Every command loads the contracts:
// a contract's expressions are parsed in one query and bound in another
// (a query each cost most of a command's start).
func (ck *checker) checkRules(c *Contract) error {
	var rules []Rule
	var queries []string
	for _, r := range c.Rules {
		if r.Check != "" {
			rules = append(rules, r)
			queries = append(queries, "SELECT "+r.Check)
		}
	}
	for _, ch := range c.Checks {
		queries = append(queries, ch.SQL) // bound when it runs (it reads other tables); parsed here
	}
	trees, err := ck.serialize(queries)
	if err != nil {
		return err
	}
	var problems, bad []error
	var used []string
	for i := range rules {
		used = funcNames(trees[i], used)
	}
	if err := ck.fns.learn(ck.db, used); err != nil {
		return err
	}
	var parsed []Rule
	for i, r := range rules {
		if err := checkExpression(trees[i], r.Check, ck.fns); err != nil {
			problems = append(problems, fmt.Errorf("%s:%d: rule %s: %v", c.File, r.line, r.Name, err))
			continue
		}
		parsed = append(parsed, r)
	}
	for i, ch := range c.Checks {
		if err := oneStatement(trees[len(rules)+i]); err != nil {
			problems = append(problems, fmt.Errorf("%s:%d: check %s: %v", c.File, ch.line, ch.Name, err))
		}
	}
	if bad, err = ck.bind(c, parsed); err != nil {
		return err
	}
	return errors.Join(append(problems, bad...)...)
}

// RowSQL is a one-row relation with the contract's columns as DuckDB
// types, all NULL: what a rule is bound against.
func RowSQL(c *Contract) string {
	cols := make([]string, len(c.Columns))
	for i, col := range c.Columns {
		cols[i] = fmt.Sprintf("CAST(NULL AS %s) AS %s", col.parsed.DuckDB(), quoteIdent(col.Name))
	}
	return "SELECT " + strings.Join(cols, ", ")
}

// tree is DuckDB's json_serialize_sql of a query.
type tree struct {
	Error      bool   `json:"error"`
	Message    string `json:"error_message"`
	Statements []struct {
		Node map[string]any `json:"node"`
	} `json:"statements"`
}

// serialize parses queries with DuckDB, all in one query.
func (ck *checker) serialize(queries []string) ([]tree, error) {
	out := make([]tree, len(queries))
	if len(queries) == 0 {
		return out, nil
	}
	lits := make([]string, len(queries))
	for i, q := range queries {
		lits[i] = "'" + strings.ReplaceAll(q, "'", "''") + "'"
	}
	rows, err := ck.db.Query(fmt.Sprintf("SELECT i, json_serialize_sql(q[i])::VARCHAR FROM (SELECT [%s] AS q), range(1, %d) AS r(i)",
		strings.Join(lits, ", "), len(queries)+1))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		var raw string
		if err := rows.Scan(&i, &raw); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(raw), &out[i-1]); err != nil {
			return nil, err
		}
	}
	return out, rows.Err()
}

// oneStatement says whether a parsed query is one statement.
func oneStatement(t tree) error {
	switch {
	case t.Error:
		return errors.New(t.Message)
	case len(t.Statements) != 1:
		return fmt.Errorf("want one SELECT, got %d statements", len(t.Statements))
	}
	return nil
}

// checkExpression checks that a parsed "SELECT <check>" selects one
// expression of the kinds a rule may use.
func checkExpression(t tree, check string, fns functions) error {
	if t.Error {
		if strings.Contains(t.Message, "Only SELECT statements") {
			return fmt.Errorf("check %q is not one expression: it holds a statement", check)
		}
		return fmt.Errorf("check %q does not parse: %s", check, t.Message)
	}
	if len(t.Statements) != 1 {
		return fmt.Errorf("check %q is not one expression", check)
	}
	node := t.Statements[0].Node
	list, _ := node["select_list"].([]any)
	from, _ := node["from_table"].(map[string]any)
	if len(list) != 1 || from["type"] != "EMPTY" || node["where_clause"] != nil || len(node["modifiers"].([]any)) > 0 {
		return fmt.Errorf("check %q is not one expression", check)
	}
	if err := walk(list[0], fns); err != nil {
		return fmt.Errorf("check %q: %v", check, err)
	}
	return nil
}

// bind binds the rules' checks against a row of c's columns, all in one
// DESCRIBE, or if that fails each alone, to name those that do not bind;
// a check must be a condition (BOOLEAN). It returns what is wrong with
// the rules.
func (ck *checker) bind(c *Contract, rules []Rule) ([]error, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	row := RowSQL(c)
	describe := func(rs []Rule) ([]string, error) {
		cols := make([]string, len(rs))
		for i, r := range rs {
			cols[i] = fmt.Sprintf("(%s) AS v%d", r.Check, i)
		}
		rows, err := ck.db.Query(fmt.Sprintf("SELECT column_type FROM (DESCRIBE SELECT %s FROM (%s))", strings.Join(cols, ", "), row))
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var types []string
		for rows.Next() {
			var typ string
			if err := rows.Scan(&typ); err != nil {
				return nil, err
			}
			types = append(types, typ)
		}
		return types, rows.Err()
	}
	var problems []error
	types, err := describe(rules)
	if err != nil {
		types = make([]string, len(rules))
		for i, r := range rules {
			one, err := describe([]Rule{r})
			if err != nil {
				problems = append(problems, fmt.Errorf("%s:%d: rule %s: check %q: %s", c.File, r.line, r.Name, r.Check, fault.Plain(err)))
				continue
			}
			types[i] = one[0]
		}
	}
	if len(types) != len(rules) {
		return nil, fmt.Errorf("binding the rules of %s gave %d types for %d rules", c.File, len(types), len(rules))
	}
	for i, r := range rules {
		if types[i] != "" && types[i] != "BOOLEAN" {
			problems = append(problems, fmt.Errorf("%s:%d: rule %s: check %q is a %s, not a condition (true or false)", c.File, r.line, r.Name, r.Check, types[i]))
		}
	}
	return problems, nil
}

// walk refuses subqueries, window functions, aggregates and functions
// whose answer can change anywhere in an expression tree.
func walk(n any, fns functions) error {
	switch v := n.(type) {
	case map[string]any:
		switch v["class"] {
		case "SUBQUERY":
			return errors.New("a subquery is not allowed (use references = … for the existence of a row of another table)")
		case "WINDOW":
			return errors.New("a window function is not allowed: a rule judges one row")
		case "FUNCTION":
			name, _ := v["function_name"].(string)
			name = strings.ToLower(name)
			if fns.unstable[name] || environmental[name] {
				return fmt.Errorf("%s() is not allowed: a rule must give the same answer whenever the change is checked (a replay, a backfill)", name)
			}
			if fns.aggregate[name] {
				return fmt.Errorf("the aggregate %s() is not allowed: a rule judges one row", name)
			}
		}
		for _, child := range v {
			if err := walk(child, fns); err != nil {
				return err
			}
		}
	case []any:
		for _, child := range v {
			if err := walk(child, fns); err != nil {
				return err
			}
		}
	}
	return nil
}

// functions classifies the DuckDB functions rules call: aggregates, and
// those whose answer is not a function of their arguments (random(),
// now(), error()).
type functions struct {
	known, aggregate, unstable map[string]bool
}

// funcNames adds the names of the functions a tree calls to names.
func funcNames(n any, names []string) []string {
	switch v := n.(type) {
	case tree:
		for _, st := range v.Statements {
			names = funcNames(st.Node, names)
		}
	case map[string]any:
		if v["class"] == "FUNCTION" {
			name, _ := v["function_name"].(string)
			names = append(names, strings.ToLower(name))
		}
		for _, c := range v {
			names = funcNames(c, names)
		}
	case []any:
		for _, c := range v {
			names = funcNames(c, names)
		}
	}
	return names
}

// learn classifies the functions named that it does not know yet, in one
// query, and only if there are any: listing DuckDB's functions costs
// about 10 ms, as much as the rest of loading the contracts.
func (fns functions) learn(db *sql.DB, names []string) error {
	var ask []string
	for _, n := range names {
		if !fns.known[n] {
			fns.known[n] = true
			ask = append(ask, "'"+strings.ReplaceAll(n, "'", "''")+"'")
		}
	}
	if len(ask) == 0 {
		return nil
	}
	rows, err := db.Query(fmt.Sprintf(`SELECT DISTINCT function_name, function_type = 'aggregate', stability <> 'CONSISTENT' FROM duckdb_functions()
		WHERE function_type IN ('aggregate', 'scalar', 'macro') AND function_name IN (%s)`, strings.Join(ask, ", ")))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		var agg, unstable sql.NullBool
		if err := rows.Scan(&n, &agg, &unstable); err != nil {
			return err
		}
		if agg.Bool {
			fns.aggregate[n] = true
		}
		if unstable.Bool {
			fns.unstable[n] = true
		}
	}
	return rows.Err()
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
