package change

import (
	"fmt"
	"slices"
	"strings"
)

// MetaColumns are the columns lakeflow adds to every silver table.
var MetaColumns = []string{"_cdc_seq", "_cdc_ord", "_commit_ts", "_deleted"}

// CheckNames reports column names the warehouse cannot hold: DuckDB
// identifiers are case-insensitive, so "ID" and "id" are one column
// there, and lakeflow's own columns are taken.
func (t *Table) CheckNames() error {
	seen := map[string]string{}
	for _, m := range MetaColumns {
		seen[m] = m
	}
	for _, c := range t.Columns {
		k := strings.ToLower(c.Name)
		if prev, dup := seen[k]; dup {
			if prev == k && isMeta(k) {
				return fmt.Errorf("table %s has a column %q, a name lakeflow keeps for its own column in silver; rename it (ALTER TABLE … RENAME COLUMN)", t.ID(), c.Name)
			}
			return fmt.Errorf("table %s has columns %q and %q, which DuckDB cannot tell apart (its identifiers ignore case); rename one (ALTER TABLE … RENAME COLUMN)", t.ID(), prev, c.Name)
		}
		seen[k] = c.Name
	}
	return nil
}

func isMeta(name string) bool {
	for _, m := range MetaColumns {
		if m == name {
			return true
		}
	}
	return false
}

// Equal reports whether two schemas are identical (Since aside).
func (t *Table) Equal(u *Table) bool {
	if t.Schema != u.Schema || t.Name != u.Name || len(t.Columns) != len(u.Columns) || !slices.Equal(t.Storage, u.Storage) {
		return false
	}
	for i := range t.Columns {
		if t.Columns[i] != u.Columns[i] {
			return false
		}
	}
	return true
}

// Evolution is a schema change that keeps every value: columns added at
// the end, and types widened.
type Evolution struct {
	Added   []Column
	Widened []Widened
}

// Widened is a column whose type widened (smallint to integer, varchar(10)
// to text, numeric(10,2) to numeric(12,2), …); From is the old type.
type Widened struct {
	Column Column
	From   Type
}

// BreakingChange is a schema change that would lose or rewrite values:
// a dropped, renamed, retyped or narrowed column, or a different key.
type BreakingChange struct {
	Table  string
	Column string
	// What happened: "dropped", "renamed", "retyped", "narrowed",
	// "key" or "reordered".
	What string
	// Old and New are the column's old and new type, or for a rename its
	// old and new name.
	Old, New string
}

func (e *BreakingChange) Error() string {
	switch e.What {
	case "dropped":
		return fmt.Sprintf("table %s: column %s was dropped", e.Table, e.Column)
	case "renamed":
		return fmt.Sprintf("table %s: column %s was renamed to %s", e.Table, e.Old, e.New)
	case "retyped":
		return fmt.Sprintf("table %s: column %s changed type from %s to %s", e.Table, e.Column, e.Old, e.New)
	case "narrowed":
		return fmt.Sprintf("table %s: column %s narrowed from %s to %s", e.Table, e.Column, e.Old, e.New)
	case "key":
		return fmt.Sprintf("table %s: the primary key changed from (%s) to (%s)", e.Table, e.Old, e.New)
	}
	return fmt.Sprintf("table %s: columns were reordered at %s", e.Table, e.Column)
}

// CheckEvolution accepts next as the successor of t when every value
// keeps its meaning: new columns at the end, and widened types. Anything
// else is a *BreakingChange.
func (t *Table) CheckEvolution(next *Table) (Evolution, error) {
	var ev Evolution
	brk := func(what, col, old, new string) error {
		return &BreakingChange{Table: t.ID(), Column: col, What: what, Old: old, New: new}
	}
	if keys, nextKeys := t.keyNames(), next.keyNames(); keys != nextKeys {
		return ev, brk("key", "", keys, nextKeys)
	}
	for i, old := range t.Columns {
		j := next.Column(old.Name)
		if j < 0 {
			// A rename keeps the column's place; a drop shifts the rest.
			if i < len(next.Columns) && t.Column(next.Columns[i].Name) < 0 && next.Columns[i].Type == old.Type {
				return ev, brk("renamed", old.Name, old.Name, next.Columns[i].Name)
			}
			return ev, brk("dropped", old.Name, "", "")
		}
		if j != i {
			return ev, brk("reordered", next.Columns[i].Name, "", "")
		}
		nc := next.Columns[j]
		switch widening(old.Type, nc.Type) {
		case typeSame:
		case typeWider:
			ev.Widened = append(ev.Widened, Widened{Column: nc, From: old.Type})
		case typeNarrower:
			return ev, brk("narrowed", old.Name, old.Type.Name, nc.Type.Name)
		default:
			return ev, brk("retyped", old.Name, old.Type.Name, nc.Type.Name)
		}
	}
	ev.Added = append(ev.Added, next.Columns[len(t.Columns):]...)
	return ev, nil
}

func (t *Table) keyNames() string {
	var names []string
	for _, i := range t.KeyColumns() {
		names = append(names, t.Columns[i].Name)
	}
	return strings.Join(names, ", ")
}

type typeChange int

const (
	typeSame typeChange = iota
	typeWider
	typeNarrower
	typeOther
)

// widening classifies a type change by what it does to values. A change
// of spelling alone (a domain to its base type, an enum to text) keeps
// them; so does a wider integer, float, numeric precision or varchar
// length. PostgreSQL may rewrite the table for such a change, but every
// value stays what it was.
func widening(from, to Type) typeChange {
	if from.Dims != to.Dims {
		return typeOther
	}
	switch {
	case from.Kind == to.Kind:
		switch from.Kind {
		case KindNumeric:
			switch {
			case from.Precision == to.Precision && from.Scale == to.Scale:
				return typeSame
			case from.Precision > 0 && to.Precision == 0:
				return typeWider
			case from.Precision > 0 && to.Precision >= from.Precision && to.Scale == from.Scale:
				return typeWider
			case to.Precision > 0 && (from.Precision == 0 || to.Precision < from.Precision) && to.Scale == from.Scale:
				return typeNarrower
			}
			return typeOther
		case KindText:
			switch {
			case from.Fixed != to.Fixed:
				return typeOther // char(n) pads, varchar does not
			case from.Length == to.Length:
				return typeSame
			case from.Fixed:
				return typeOther // a new char(n) length re-pads every value
			case to.Length == 0 || (from.Length > 0 && to.Length > from.Length):
				return typeWider
			}
			return typeNarrower
		}
		return typeSame
	case rank(from.Kind) > 0 && rank(to.Kind) > 0 && family(from.Kind) == family(to.Kind):
		if rank(to.Kind) > rank(from.Kind) {
			return typeWider
		}
		return typeNarrower
	}
	return typeOther
}

// rank orders the integer and float kinds by width.
func rank(k Kind) int {
	switch k {
	case KindInt2, KindFloat4:
		return 1
	case KindInt4, KindFloat8:
		return 2
	case KindInt8:
		return 3
	}
	return 0
}

func family(k Kind) string {
	if k == KindFloat4 || k == KindFloat8 {
		return "float"
	}
	return "int"
}
