package change

import (
	"strings"
)

// QualifiedName spells a table as source.tables does: schema.table,
// exactly as PostgreSQL stores the names (case-sensitive, spaces and
// non-ASCII letters as they are), with double quotes only around a part
// that holds a dot or a double quote (sales."a.b"), so the spelling is
// unambiguous.
func QualifiedName(schema, name string) string {
	return quotePart(schema) + "." + quotePart(name)
}

func quotePart(s string) string {
	if s != "" && !strings.ContainsAny(s, `."`) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// SafeName maps a name to the characters Kafka allows in topic names
// (letters, digits, '_' and '-'; '.' separates the parts of a topic name):
// every other character, non-ASCII letters and dots included, becomes '_'.
// Topic names and lake directories use it, so two names that differ only
// in such characters collide, and lakeflow refuses them at start.
func SafeName(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}
