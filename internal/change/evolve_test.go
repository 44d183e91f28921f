package change

import (
	"strings"
	"testing"
)

// TestMoved: columns that follow one they preceded are reported (a
// swap of names, a column dropped and added again in one transaction);
// drops, additions, renames, and a new column under a renamed one's old
// name are not.
func TestMoved(t *testing.T) {
	table := func(names ...string) *Table {
		tb := &Table{Schema: "public", Name: "t"}
		for _, n := range names {
			tb.Columns = append(tb.Columns, Column{Name: n, Type: Type{Kind: KindInt4, Name: "integer"}})
		}
		return tb
	}
	for _, c := range []struct {
		name       string
		prev, next *Table
		renames    map[string]string
		want       string
	}{
		{"swapped", table("id", "m", "n"), table("id", "n", "m"), nil, "m after n"},
		{"swapped, renames listed", table("id", "m", "n", "o"), table("id", "n", "m", "o"), map[string]string{"n": "m", "m": "n"}, ""},
		{"dropped and added again", table("id", "r", "s", "t"), table("id", "s", "t", "r"), nil, "r after t"},
		{"dropped and added again, then more", table("id", "r", "s"), table("id", "s", "r", "x"), nil, "r after s"},
		{"middle dropped", table("id", "r", "s"), table("id", "s"), nil, ""},
		{"added", table("id", "r"), table("id", "r", "s"), nil, ""},
		{"renamed", table("id", "b", "c"), table("id", "bb", "c"), map[string]string{"bb": "b"}, ""},
		{"renamed, old name added", table("id", "j", "x"), table("id", "jj", "x", "j"), map[string]string{"jj": "j"}, ""},
	} {
		var got []string
		for _, bc := range c.prev.Moved(c.next, c.renames) {
			got = append(got, bc.Column+" after "+bc.New)
		}
		if strings.Join(got, ", ") != c.want {
			t.Errorf("%s: moved %q, want %q", c.name, got, c.want)
		}
	}
}
