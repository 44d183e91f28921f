package config

import (
	"fmt"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// Table names one captured source table, exactly as PostgreSQL stores
// its schema and name.
type Table struct {
	Schema string
	Name   string
}

// String spells the table as source.tables does (change.QualifiedName).
func (t Table) String() string { return change.QualifiedName(t.Schema, t.Name) }

// ParseTable reads one source.tables entry: schema.table as \dt shows it,
// case-sensitive; a part may be double-quoted ("" is a quote inside it),
// which a name holding a dot needs (sales."a.b"). Without a schema the
// table is in public.
func ParseTable(s string) (Table, error) {
	var parts []string
	var cur strings.Builder
	quoted, inQuotes := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inQuotes && c == '"' && i+1 < len(s) && s[i+1] == '"':
			cur.WriteByte('"')
			i++
		case inQuotes && c == '"':
			inQuotes = false
			if i+1 < len(s) && s[i+1] != '.' {
				return Table{}, fmt.Errorf("%q: a closing quote must end its part", s)
			}
		case inQuotes:
			cur.WriteByte(c)
		case c == '"' && cur.Len() == 0 && !quoted:
			inQuotes, quoted = true, true
		case c == '"':
			return Table{}, fmt.Errorf("%q: quote a whole part (\"My Table\"), not part of it", s)
		case c == '.':
			parts = append(parts, cur.String())
			cur.Reset()
			quoted = false
		default:
			cur.WriteByte(c)
		}
	}
	if inQuotes {
		return Table{}, fmt.Errorf("%q: unterminated quote", s)
	}
	parts = append(parts, cur.String())
	switch len(parts) {
	case 1:
		parts = []string{"public", parts[0]}
	case 2:
	default:
		return Table{}, fmt.Errorf("%q has %d dot-separated parts; write schema.table, and quote a name that holds a dot (sales.\"a.b\")", s, len(parts))
	}
	for _, p := range parts {
		if p == "" {
			return Table{}, fmt.Errorf("%q: want schema.table with both names non-empty", s)
		}
	}
	return Table{Schema: parts[0], Name: parts[1]}, nil
}

// tableList parses source.tables and refuses two tables that would share
// a topic, a lake directory or a silver table: topic names and lake
// directories map other characters to '_' (change.SafeName), and DuckDB,
// where silver.<table> lives, ignores case.
func tableList(entries []string, bad func(format string, args ...any)) []Table {
	var out []Table
	claims := map[string]string{}
	claim := func(key, what string, t Table) bool {
		if prev, dup := claims[key]; dup {
			if prev != t.String() {
				bad("%s and %s would share %s; capture only one of them", prev, t, what)
			} else {
				bad("%s is listed twice", t)
			}
			return false
		}
		claims[key] = t.String()
		return true
	}
	for _, e := range entries {
		t, err := ParseTable(e)
		if err != nil {
			bad("%v", err)
			continue
		}
		if dir := change.SafeName(t.Name); lake.Reserved(dir) {
			bad("%s cannot be captured: its lake directory would be lake/%s, which holds lakeflow's own files", t, dir)
			continue
		}
		safeTopic := change.SafeName(t.Schema) + "." + change.SafeName(t.Name)
		if !claim("silver:"+strings.ToLower(t.Name), "silver."+t.Name+" (DuckDB ignores case)", t) ||
			!claim("topic:"+safeTopic, "the topic <prefix>."+safeTopic, t) ||
			!claim("lake:"+strings.ToLower(change.SafeName(t.Name)), "the lake directory "+change.SafeName(t.Name), t) {
			continue
		}
		out = append(out, t)
	}
	return out
}
