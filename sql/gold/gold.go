// Package gold holds the gold marts: the demo's SQL files (embedded: a
// lakeflow binary without a gold directory beside its config uses them)
// and the reading of a mart file.
//
// A mart is one .sql file: a header of comment lines, then one SELECT over
// silver tables. The header declares the mart's grain, so lakeflow can
// refresh only what a batch touched:
//
//	-- grain: order_date
//	-- touched by silver.orders: created_at::DATE
//	-- touched by silver.order_items: SELECT o.created_at::DATE FROM changed c JOIN silver.orders o ON o.id = c.order_id
//
// grain names the mart column whose values partition it (a day, a
// customer), or is "full" for a mart rebuilt whole. Each silver table the
// SELECT reads has a "touched by" line: for a changed row of that table
// (its image before and after the batch, in the relation changed), the
// grain values whose rows may change, as an expression over the row or a
// SELECT over changed. The SELECT reads the values to refresh from the
// table lakeflow_refresh(grain); lakeflow also keeps only rows of those
// values, so the filter is for speed.
package gold

import (
	"bufio"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Demo are the demo's marts.
//
//go:embed *.sql
var Demo embed.FS

// Full is the grain of a mart rebuilt whole.
const Full = "full"

// Mart is one mart file.
type Mart struct {
	// Name is the mart's table, gold.<Name>: the file's name.
	Name string
	// File names the file in messages.
	File string
	// SQL is the file's whole text, so DuckDB's line numbers are the
	// file's.
	SQL string
	// Grain is the column that partitions the mart, or Full.
	Grain string
	// Touched maps a silver table's name to the SELECT over changed that
	// gives the grain values a change of it touches.
	Touched map[string]string
	// TouchedLine is the header line of each Touched entry.
	TouchedLine map[string]int
	// Description is the header's opening comment (before an indented
	// line or a header key), without a leading "gold.<name>:".
	Description string
}

// Load reads every .sql file of fsys; dir names the directory in
// messages.
func Load(fsys fs.FS, dir string) ([]Mart, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var marts []Mart
	var problems []string
	for _, n := range names {
		data, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		m, err := parse(path.Join(dir, n), strings.TrimSuffix(n, ".sql"), string(data))
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		marts = append(marts, m)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return marts, nil
}

// parse reads a mart file's header.
func parse(file, name, text string) (Mart, error) {
	m := Mart{Name: name, File: file, SQL: text, Touched: map[string]string{}, TouchedLine: map[string]int{}}
	bad := func(line int, format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...))
	}
	if !validName(name) {
		return m, bad(1, "a mart's file name is its table's name: use letters, digits and _ (like daily_revenue.sql)")
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for line := 1; sc.Scan(); line++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" {
			continue
		}
		if !strings.HasPrefix(l, "--") {
			break // the header ends at the SELECT
		}
		raw := strings.TrimPrefix(l, "--")
		l = strings.TrimSpace(raw)
		if describing := m.Grain == "" && len(m.Touched) == 0 && !strings.HasPrefix(raw, "  "); describing &&
			!strings.HasPrefix(l, "grain:") && !strings.HasPrefix(l, "touched by ") {
			m.Description = strings.TrimSpace(m.Description + " " + strings.TrimPrefix(l, "gold."+name+":"))
			continue
		}
		switch {
		case strings.HasPrefix(l, "grain:"):
			if m.Grain != "" {
				return m, bad(line, "grain is declared twice")
			}
			m.Grain = strings.TrimSpace(strings.TrimPrefix(l, "grain:"))
			if m.Grain == "" {
				return m, bad(line, "grain: name the mart column that partitions it, or say full")
			}
		case strings.HasPrefix(l, "touched by "):
			table, expr, ok := strings.Cut(strings.TrimPrefix(l, "touched by "), ":")
			table, expr = strings.TrimSpace(table), strings.TrimSpace(expr)
			silver, found := strings.CutPrefix(table, "silver.")
			if !ok || !found || silver == "" || expr == "" {
				return m, bad(line, "want \"-- touched by silver.<table>: <expression or SELECT over changed>\"")
			}
			if _, dup := m.Touched[silver]; dup {
				return m, bad(line, "touched by %s is declared twice", table)
			}
			if !strings.HasPrefix(strings.ToUpper(expr), "SELECT") {
				expr = "SELECT " + expr + " FROM changed"
			}
			m.Touched[silver], m.TouchedLine[silver] = expr, line
		}
	}
	if m.Grain == "" {
		return m, bad(1, "the header lacks \"-- grain: <column>\" (or \"-- grain: full\")")
	}
	if m.Grain == Full && len(m.Touched) > 0 {
		return m, bad(m.TouchedLine[firstKey(m.Touched)], "a mart with grain full is rebuilt whole: it takes no touched by lines")
	}
	// The header's opening words begin a sentence.
	if r, n := utf8.DecodeRuneInString(m.Description); n > 0 {
		m.Description = string(unicode.ToUpper(r)) + m.Description[n:]
	}
	return m, nil
}

func validName(s string) bool {
	for i, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return s != ""
}

func firstKey(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys[0]
}
