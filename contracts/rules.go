package contracts

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	_ "github.com/duckdb/duckdb-go/v2" // DuckDB parses and binds the rules
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
	fns, err := functionKinds(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &checker{db: db, fns: fns}, nil
}

func (ck *checker) close() error { return ck.db.Close() }

// checkRules checks every check expression of c: one SQL boolean
// expression over a row of the table's columns, without subqueries,
// aggregates, window functions or volatile functions. DuckDB parses and
// binds it, so an unknown column, a type error or a syntax error is found
// here, not in the middle of a batch.
func (ck *checker) checkRules(c *Contract) error {
	db, fns := ck.db, ck.fns
	row := RowSQL(c)
	var problems []error
	for _, r := range c.Rules {
		if r.Check == "" {
			continue
		}
		if err := checkExpression(db, row, r.Check, fns); err != nil {
			problems = append(problems, fmt.Errorf("%s:%d: rule %s: %v", c.File, r.line, r.Name, err))
		}
	}
	for _, ch := range c.Checks {
		// Bound when it runs (it reads other tables); parsed here.
		if err := parses(db, ch.SQL); err != nil {
			problems = append(problems, fmt.Errorf("%s:%d: check %s: %v", c.File, ch.line, ch.Name, err))
		}
	}
	return errors.Join(problems...)
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

// parses says whether query is one SELECT DuckDB can parse.
func parses(db *sql.DB, query string) error {
	var raw string
	if err := db.QueryRow("SELECT json_serialize_sql(?::VARCHAR)::VARCHAR", query).Scan(&raw); err != nil {
		return err
	}
	var tree struct {
		Error      bool   `json:"error"`
		Message    string `json:"error_message"`
		Statements []any  `json:"statements"`
	}
	if err := json.Unmarshal([]byte(raw), &tree); err != nil {
		return err
	}
	switch {
	case tree.Error:
		return errors.New(tree.Message)
	case len(tree.Statements) != 1:
		return fmt.Errorf("want one SELECT, got %d statements", len(tree.Statements))
	}
	return nil
}

func checkExpression(db *sql.DB, row, check string, fns functions) error {
	var ast string
	if err := db.QueryRow("SELECT json_serialize_sql(?::VARCHAR)::VARCHAR", "SELECT "+check).Scan(&ast); err != nil {
		return err
	}
	var tree struct {
		Error      bool   `json:"error"`
		Message    string `json:"error_message"`
		Statements []struct {
			Node map[string]any `json:"node"`
		} `json:"statements"`
	}
	if err := json.Unmarshal([]byte(ast), &tree); err != nil {
		return err
	}
	if tree.Error {
		if strings.Contains(tree.Message, "Only SELECT statements") {
			return fmt.Errorf("check %q is not one expression: it holds a statement", check)
		}
		return fmt.Errorf("check %q does not parse: %s", check, tree.Message)
	}
	if len(tree.Statements) != 1 {
		return fmt.Errorf("check %q is not one expression", check)
	}
	node := tree.Statements[0].Node
	list, _ := node["select_list"].([]any)
	from, _ := node["from_table"].(map[string]any)
	if len(list) != 1 || from["type"] != "EMPTY" || node["where_clause"] != nil || len(node["modifiers"].([]any)) > 0 {
		return fmt.Errorf("check %q is not one expression", check)
	}
	if err := walk(list[0], fns); err != nil {
		return fmt.Errorf("check %q: %v", check, err)
	}
	var typ string
	err := db.QueryRow(fmt.Sprintf("SELECT column_type FROM (DESCRIBE SELECT (%s) AS verdict FROM (%s))", check, row)).Scan(&typ)
	if err != nil {
		return fmt.Errorf("check %q: %s", check, strings.Join(strings.Fields(err.Error()), " "))
	}
	if typ != "BOOLEAN" {
		return fmt.Errorf("check %q is a %s, not a condition (true or false)", check, typ)
	}
	return nil
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

// functions classifies DuckDB's functions: aggregates, and those whose
// answer is not a function of their arguments (random(), now(), error()).
type functions struct {
	aggregate, unstable map[string]bool
}

func functionKinds(db *sql.DB) (functions, error) {
	fns := functions{aggregate: map[string]bool{}, unstable: map[string]bool{}}
	rows, err := db.Query(`SELECT DISTINCT function_name, function_type = 'aggregate', stability <> 'CONSISTENT' FROM duckdb_functions()
		WHERE function_type IN ('aggregate', 'scalar', 'macro')`)
	if err != nil {
		return fns, err
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		var agg, unstable sql.NullBool
		if err := rows.Scan(&n, &agg, &unstable); err != nil {
			return fns, err
		}
		if agg.Bool {
			fns.aggregate[n] = true
		}
		if unstable.Bool {
			fns.unstable[n] = true
		}
	}
	return fns, rows.Err()
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
