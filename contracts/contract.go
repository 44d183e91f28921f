// Package contracts holds the data contracts: one TOML file per captured
// table in contracts.dir (columns with types and nullability, key, owner,
// consumers, freshness SLA, compatibility mode, whether the table keeps
// SCD2 history, and named rules), and the code that loads and checks
// them. A contract is refused at load, naming file, line and reason, when
// it names an unknown column, a bad type, a rule twice, or a rule that is
// not a single boolean expression over one row.
package contracts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// Mode is a table's compatibility mode: which source schema changes
// evolve silver by themselves. Any other change stops ingestion until the
// contract accepts it.
type Mode string

// The compatibility modes.
const (
	// Backward (the default): silver, reading the new shape, can still
	// read the old: new columns and widened types evolve.
	Backward Mode = "backward"
	// Forward: readers of the old shape can read the new: new columns and
	// narrowed types evolve.
	Forward Mode = "forward"
	// Full: both: only new columns evolve.
	Full Mode = "full"
	// None: every change evolves, as far as silver can follow it.
	None Mode = "none"
)

// Action is what a failed rule does to the change.
type Action string

// The rule actions.
const (
	// Quarantine (the default): the change does not reach silver, which
	// keeps the last version that passed; it is kept in
	// lakeflow.quarantine.
	Quarantine Action = "quarantine"
	// Warn: the change is applied and the failure recorded.
	Warn Action = "warn"
	// Fail: ingestion stops, naming the change.
	Fail Action = "fail"
)

// Contract is one table's contract.
type Contract struct {
	// File is the contract's path.
	File          string
	Table         config.Table
	Owner         string
	Consumers     []string
	Description   string
	Freshness     time.Duration
	Compatibility Mode
	// History says the table keeps SCD2 history (silver.<table>_history).
	History bool
	Key     []string
	Columns []Column
	Rules   []Rule
	// Checks are population checks: lakeflow check runs them over the
	// whole warehouse and lake, not per change.
	Checks []Check
}

// Check is a population check: a query over silver, history, gold, the
// lake (lake.<table>) and lakeflow.quarantine whose rows are the
// violations, each named by its key column if it has one.
type Check struct {
	// Name is the table's name dotted with the check's.
	Name        string
	SQL         string
	Severity    Severity
	Description string
	line        int
}

// Severity is how much a failed population check matters.
type Severity string

// The severities.
const (
	// Error fails lakeflow check.
	Error Severity = "error"
	// Warning is reported; lakeflow check still passes.
	Warning Severity = "warning"
)

// Column is a column the contract declares.
type Column struct {
	Name string
	// Type is PostgreSQL's spelling; Base the built-in type a non-built-in
	// one is stored as.
	Type        string
	Base        string
	Nullable    bool
	Description string
	// RenamedFrom accepts a rename: the column was called so before.
	RenamedFrom string
	parsed      change.Type
}

// Rule is a named check of one row. Every column declared
// nullable = false (the key aside) has the rule <table>.<column>_not_null.
type Rule struct {
	// Name is the table's name dotted with the rule's: orders.total_non_negative.
	Name        string
	Check       string
	References  *Reference
	Action      Action
	Description string
	line        int
}

// Reference is the existence form of a rule: the row its columns point
// to exists, and is not deleted, in silver as of the change's position.
type Reference struct {
	Table config.Table
	// Columns maps this table's columns to the referenced table's.
	Columns [][2]string
}

// Set is the loaded contracts, by table (change.QualifiedName).
type Set map[string]*Contract

// For returns the contract of a table, or nil.
func (s Set) For(schema, name string) *Contract { return s[change.QualifiedName(schema, name)] }

// file mirrors a contract file.
type file struct {
	Table         string       `toml:"table"`
	Owner         string       `toml:"owner"`
	Consumers     []string     `toml:"consumers"`
	Description   string       `toml:"description"`
	Freshness     string       `toml:"freshness"`
	Compatibility string       `toml:"compatibility"`
	History       bool         `toml:"history"`
	Key           []string     `toml:"key"`
	Columns       []columnFile `toml:"columns"`
	Rules         []ruleFile   `toml:"rules"`
	Checks        []checkFile  `toml:"checks"`
}

type checkFile struct {
	Name        string `toml:"name"`
	SQL         string `toml:"sql"`
	Severity    string `toml:"severity"`
	Description string `toml:"description"`
}

type columnFile struct {
	Name        string `toml:"name"`
	Type        string `toml:"type"`
	Base        string `toml:"base"`
	Nullable    *bool  `toml:"nullable"`
	Description string `toml:"description"`
	RenamedFrom string `toml:"renamed_from"`
}

type ruleFile struct {
	Name        string            `toml:"name"`
	Check       string            `toml:"check"`
	References  string            `toml:"references"`
	On          map[string]string `toml:"on"`
	Action      string            `toml:"action"`
	Description string            `toml:"description"`
}

// Load reads every *.toml file of dir (a missing dir is an empty set) and
// checks each contract, its rules included. Every problem is reported
// with its file and line.
func Load(dir string) (Set, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.toml"))
	if err != nil {
		return nil, fmt.Errorf("%w: contracts.dir %s: %v", fault.ErrConfig, dir, err)
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		return Set{}, nil
	}
	ck, err := newChecker()
	if err != nil {
		return nil, err
	}
	defer ck.close()
	set := Set{}
	var problems []error
	for _, p := range paths {
		c, err := loadFile(p, ck)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		id := c.Table.String()
		if prev, dup := set[id]; dup {
			problems = append(problems, fmt.Errorf("%s: table %s already has the contract %s", p, id, prev.File))
			continue
		}
		set[id] = c
	}
	if err := set.checkReferences(); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: contracts: %w", fault.ErrConfig, errors.Join(problems...))
	}
	return set, nil
}

func loadFile(path string, ck *checker) (*Contract, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f file
	if err := config.DecodeStrict(path, data, &f); err != nil {
		return nil, err
	}
	lines := newLines(data)
	bad := func(line int, format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", path, line, fmt.Sprintf(format, args...))
	}
	c := &Contract{File: path, Owner: f.Owner, Consumers: f.Consumers, Description: f.Description,
		Compatibility: Mode(f.Compatibility), History: f.History, Key: f.Key}
	var problems []error
	if c.Table, err = config.ParseTable(f.Table); err != nil || f.Table == "" {
		problems = append(problems, bad(lines.key("table"), "table: want the captured table as schema.table (%v)", err))
	}
	if f.Freshness != "" {
		if c.Freshness, err = time.ParseDuration(f.Freshness); err != nil || c.Freshness <= 0 {
			problems = append(problems, bad(lines.key("freshness"), "freshness %q is not a duration like \"15m\"", f.Freshness))
		}
	}
	switch c.Compatibility {
	case "":
		c.Compatibility = Backward
	case Backward, Forward, Full, None:
	default:
		problems = append(problems, bad(lines.key("compatibility"), "compatibility %q: want backward, forward, full or none", f.Compatibility))
	}
	names := map[string]bool{}
	renamed := map[string]string{} // old name (lower case): the column renamed from it
	for i, cf := range f.Columns {
		line := lines.block("columns", i)
		col := Column{Name: cf.Name, Type: cf.Type, Base: cf.Base, Nullable: cf.Nullable == nil || *cf.Nullable,
			Description: cf.Description, RenamedFrom: cf.RenamedFrom}
		if cf.Name == "" {
			problems = append(problems, bad(line, "a column without a name"))
			continue
		}
		if names[strings.ToLower(cf.Name)] {
			problems = append(problems, bad(line, "column %s is declared twice (DuckDB ignores case)", cf.Name))
		}
		names[strings.ToLower(cf.Name)] = true
		if from := strings.ToLower(cf.RenamedFrom); from != "" {
			if other, ok := renamed[from]; ok {
				problems = append(problems, bad(line, "columns %s and %s are both renamed_from %q: a column was renamed to one name", other, cf.Name, cf.RenamedFrom))
			}
			renamed[from] = cf.Name
		}
		if col.parsed, err = ParseType(cf.Type, cf.Base); err != nil {
			problems = append(problems, bad(line, "column %s: %v", cf.Name, err))
		}
		c.Columns = append(c.Columns, col)
	}
	if len(c.Columns) == 0 {
		problems = append(problems, bad(1, "no [[columns]]: list the table's columns (lakeflow contracts init writes them)"))
	}
	for _, k := range c.Key {
		if c.Column(k) == nil {
			problems = append(problems, bad(lines.key("key"), "key column %s is not among the columns", k))
		}
	}
	if len(c.Key) == 0 {
		problems = append(problems, bad(lines.key("key"), "key: name the primary key columns"))
	}
	rules := map[string]bool{}
	for i, rf := range f.Rules {
		line := lines.block("rules", i)
		r, err := c.rule(rf, line)
		if err != nil {
			problems = append(problems, bad(line, "%v", err))
			continue
		}
		if rules[r.Name] {
			problems = append(problems, bad(line, "rule %s is declared twice", r.Name))
			continue
		}
		rules[r.Name] = true
		c.Rules = append(c.Rules, r)
	}
	for i, cf := range f.Checks {
		line := lines.block("checks", i)
		ch := Check{Name: c.Table.Name + "." + cf.Name, SQL: strings.TrimSpace(cf.SQL), Severity: Severity(cf.Severity), Description: cf.Description, line: line}
		switch {
		case cf.Name == "" || strings.ContainsAny(cf.Name, ". \""):
			problems = append(problems, bad(line, "check name %q: want a word like total_matches_items (it is prefixed with the table's name)", cf.Name))
			continue
		case rules[ch.Name]:
			problems = append(problems, bad(line, "%s is declared twice", ch.Name))
			continue
		case ch.SQL == "":
			problems = append(problems, bad(line, "check %s: sql is missing: a SELECT whose rows are the violations", ch.Name))
			continue
		}
		switch ch.Severity {
		case "":
			ch.Severity = Error
		case Error, Warning:
		default:
			problems = append(problems, bad(line, "check %s: severity %q: want error or warning", ch.Name, cf.Severity))
			continue
		}
		rules[ch.Name] = true
		c.Checks = append(c.Checks, ch)
	}
	for _, col := range c.Columns {
		// A column declared NOT NULL is a rule too (a key column cannot
		// be NULL at the source).
		name := c.Table.Name + "." + col.Name + "_not_null"
		if col.Nullable || slices.Contains(c.Key, col.Name) || rules[name] {
			continue
		}
		c.Rules = append(c.Rules, Rule{Name: name, Check: quoteIdent(col.Name) + " IS NOT NULL", Action: Quarantine,
			Description: "declared nullable = false", line: lines.block("columns", slices.IndexFunc(f.Columns, func(cf columnFile) bool { return cf.Name == col.Name }))})
	}
	if len(problems) == 0 {
		if err := ck.checkRules(c); err != nil {
			problems = append(problems, err)
		}
	}
	return c, errors.Join(problems...)
}

// rule reads one [[rules]] entry.
func (c *Contract) rule(rf ruleFile, line int) (Rule, error) {
	r := Rule{Action: Action(rf.Action), Description: rf.Description, Check: strings.TrimSpace(rf.Check), line: line}
	if rf.Name == "" || strings.ContainsAny(rf.Name, ". \"") {
		return r, fmt.Errorf("rule name %q: want a word like total_non_negative (it is prefixed with the table's name)", rf.Name)
	}
	r.Name = c.Table.Name + "." + rf.Name
	switch r.Action {
	case "":
		r.Action = Quarantine
	case Quarantine, Warn, Fail:
	default:
		return r, fmt.Errorf("rule %s: action %q: want quarantine, warn or fail", r.Name, rf.Action)
	}
	switch {
	case (r.Check == "") == (rf.References == ""):
		return r, fmt.Errorf("rule %s: give either check (an SQL condition) or references (the existence form)", r.Name)
	case rf.References != "":
		t, err := config.ParseTable(rf.References)
		if err != nil {
			return r, fmt.Errorf("rule %s: references: %v", r.Name, err)
		}
		if len(rf.On) == 0 {
			return r, fmt.Errorf("rule %s: references needs on = { <column> = \"<referenced column>\" }", r.Name)
		}
		ref := &Reference{Table: t}
		for local, remote := range rf.On {
			if c.Column(local) == nil {
				return r, fmt.Errorf("rule %s: on: %s is not a column of %s", r.Name, local, c.Table)
			}
			ref.Columns = append(ref.Columns, [2]string{local, remote})
		}
		slices.SortFunc(ref.Columns, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
		r.References = ref
	}
	return r, nil
}

// Column returns the named column, or nil.
func (c *Contract) Column(name string) *Column {
	for i := range c.Columns {
		if c.Columns[i].Name == name {
			return &c.Columns[i]
		}
	}
	return nil
}

// checkReferences checks that every referenced table has a contract that
// declares the referenced columns, with types the referring ones compare
// with.
func (s Set) checkReferences() error {
	var problems []error
	for _, c := range s {
		for _, r := range c.Rules {
			if r.References == nil {
				continue
			}
			target := s[r.References.Table.String()]
			if target == nil {
				problems = append(problems, fmt.Errorf("%s:%d: rule %s references %s, which has no contract", c.File, r.line, r.Name, r.References.Table))
				continue
			}
			for _, pair := range r.References.Columns {
				if target.Column(pair[1]) == nil {
					problems = append(problems, fmt.Errorf("%s:%d: rule %s: %s has no column %s", c.File, r.line, r.Name, r.References.Table, pair[1]))
				}
			}
		}
	}
	return errors.Join(problems...)
}

// lines finds where keys and [[blocks]] of a TOML file start, for error
// messages (the decoder does not keep positions).
type lines []string

func newLines(data []byte) lines { return strings.Split(string(data), "\n") }

// key is the line of a top-level key (1 if absent).
func (l lines) key(name string) int {
	for i, s := range l {
		s = strings.TrimSpace(s)
		if strings.HasPrefix(s, "[") {
			break
		}
		if k, _, ok := strings.Cut(s, "="); ok && strings.TrimSpace(k) == name {
			return i + 1
		}
	}
	return 1
}

// block is the line of the n-th [[name]] header.
func (l lines) block(name string, n int) int {
	for i, s := range l {
		if strings.TrimSpace(s) == "[["+name+"]]" {
			if n == 0 {
				return i + 1
			}
			n--
		}
	}
	return 1
}
