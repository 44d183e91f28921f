package contracts

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	_ "github.com/duckdb/duckdb-go/v2" // DuckDB parses and binds the rules
)

// volatile are functions a rule may not call: they have side effects, or
// give another answer when the same change is checked again (a replay, a
// backfill, a time-travel query), so stream and rebuild would disagree.
var volatile = map[string]bool{
	"random": true, "setseed": true, "nextval": true, "currval": true, "uuid": true, "gen_random_uuid": true,
	"uuidv4": true, "uuidv7": true, "now": true, "current_timestamp": true, "get_current_timestamp": true,
	"current_date": true, "current_time": true, "today": true, "get_current_time": true, "transaction_timestamp": true,
	"getenv": true, "current_setting": true, "txid_current": true, "read_csv": true, "read_parquet": true,
	"read_json": true, "glob": true, "query": true, "query_table": true,
}

// checkRules checks every check expression of c: one SQL boolean
// expression over a row of the table's columns, without subqueries,
// aggregates, window functions or volatile functions. DuckDB parses and
// binds it, so an unknown column, a type error or a syntax error is found
// here, not in the middle of a batch.
func checkRules(c *Contract) error {
	db, err := sql.Open("duckdb", "")
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	aggregates, err := aggregateNames(db)
	if err != nil {
		return err
	}
	row := RowSQL(c)
	var problems []error
	for _, r := range c.Rules {
		if r.Check == "" {
			continue
		}
		if err := checkExpression(db, row, r.Check, aggregates); err != nil {
			problems = append(problems, fmt.Errorf("%s:%d: rule %s: %v", c.File, r.line, r.Name, err))
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

func checkExpression(db *sql.DB, row, check string, aggregates map[string]bool) error {
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
	if err := walk(list[0], aggregates); err != nil {
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

// walk refuses subqueries, window functions, aggregates and volatile
// functions anywhere in an expression tree.
func walk(n any, aggregates map[string]bool) error {
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
			if volatile[name] {
				return fmt.Errorf("%s() is not allowed: a rule must give the same answer whenever the change is checked", name)
			}
			if aggregates[name] {
				return fmt.Errorf("the aggregate %s() is not allowed: a rule judges one row", name)
			}
		}
		for _, child := range v {
			if err := walk(child, aggregates); err != nil {
				return err
			}
		}
	case []any:
		for _, child := range v {
			if err := walk(child, aggregates); err != nil {
				return err
			}
		}
	}
	return nil
}

func aggregateNames(db *sql.DB) (map[string]bool, error) {
	rows, err := db.Query("SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type = 'aggregate'")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out[n] = true
	}
	return out, rows.Err()
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
