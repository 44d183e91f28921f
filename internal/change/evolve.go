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

// Diff is every difference between a table's schema and its successor.
type Diff struct {
	Added    []Column
	Widened  []Retyped // every value fits the new type, and keeps its meaning
	Narrowed []Retyped // PostgreSQL checked that every value fits
	Retyped  []Retyped // any other type change
	Dropped  []Column
	Renamed  []Renamed
	// Key is set when the primary key changed.
	Key *BreakingChange
}

// Retyped is a column whose type changed; From is the old type.
type Retyped struct {
	Column Column
	From   Type
}

// Renamed is a column that changed its name.
type Renamed struct {
	From, To string
}

// Diff compares t with its successor next. renames (new name → old name)
// says which columns were renamed; without it a column that is gone is
// dropped and one that is new is added.
func (t *Table) Diff(next *Table, renames map[string]string) Diff {
	var d Diff
	matched := map[string]bool{}
	for _, nc := range next.Columns {
		old := nc.Name
		if from, ok := renames[nc.Name]; ok {
			old = from
		}
		i := t.Column(old)
		if i < 0 {
			d.Added = append(d.Added, nc)
			continue
		}
		matched[old] = true
		if old != nc.Name {
			d.Renamed = append(d.Renamed, Renamed{From: old, To: nc.Name})
		}
		oc := t.Columns[i]
		switch widening(oc.Type, nc.Type) {
		case typeWider:
			d.Widened = append(d.Widened, Retyped{Column: nc, From: oc.Type})
		case typeNarrower:
			d.Narrowed = append(d.Narrowed, Retyped{Column: nc, From: oc.Type})
		case typeOther:
			d.Retyped = append(d.Retyped, Retyped{Column: nc, From: oc.Type})
		}
	}
	for _, oc := range t.Columns {
		if !matched[oc.Name] {
			d.Dropped = append(d.Dropped, oc)
		}
	}
	var oldKeys []string
	for _, i := range t.KeyColumns() {
		name := t.Columns[i].Name
		for n, o := range renames {
			if o == name {
				name = n
			}
		}
		oldKeys = append(oldKeys, name)
	}
	if keys := next.keyNames(); strings.Join(oldKeys, ", ") != keys {
		d.Key = &BreakingChange{Table: t.ID(), What: "key", Old: t.keyNames(), New: keys}
	}
	return d
}

// Moved lists the columns of next (matched to t's by name, or by renames:
// new name → old name) that follow a column they preceded in t.
// PostgreSQL keeps a table's columns in the order they were added, so
// such a name was given to another column (columns renamed into each
// other's names), or dropped and added again, with no change to the table
// between (a Relation message comes with a change, and names the columns,
// nothing more): which values are which cannot be told.
func (t *Table) Moved(next *Table, renames map[string]string) []BreakingChange {
	var out []BreakingChange
	renamedFrom := map[string]bool{}
	for _, from := range renames {
		renamedFrom[from] = true
	}
	last, lastName := -1, ""
	for _, nc := range next.Columns {
		old, renamed := renames[nc.Name]
		if !renamed {
			old = nc.Name
		}
		switch i := t.Column(old); {
		case i < 0 || (!renamed && renamedFrom[old]): // new (under a renamed column's old name)
		case i < last:
			out = append(out, BreakingChange{Table: t.ID(), Column: nc.Name, What: "moved", New: lastName})
		default:
			last, lastName = i, nc.Name
		}
	}
	return out
}

// Breaking lists the changes of d from old to next that do not keep every
// value as it is (all but new columns and widened types). A dropped column
// whose place a new one of its type took reads as a rename, which is how
// a Relation message shows PostgreSQL's RENAME COLUMN.
func (d Diff) Breaking(old, next *Table) []BreakingChange {
	var out []BreakingChange
	brk := func(what, col, from, to string) {
		out = append(out, BreakingChange{Table: old.ID(), Column: col, What: what, Old: from, New: to})
	}
	if d.Key != nil {
		out = append(out, *d.Key)
	}
	for _, r := range d.Renamed {
		brk("renamed", r.From, r.From, r.To)
	}
	for _, dc := range d.Dropped {
		i := old.Column(dc.Name)
		if i < len(next.Columns) && old.Column(next.Columns[i].Name) < 0 && next.Columns[i].Type == dc.Type {
			brk("renamed", dc.Name, dc.Name, next.Columns[i].Name)
			continue
		}
		brk("dropped", dc.Name, dc.Type.Name, "")
	}
	for _, r := range d.Narrowed {
		brk("narrowed", r.Column.Name, r.From.Name, r.Column.Type.Name)
	}
	for _, r := range d.Retyped {
		brk("retyped", r.Column.Name, r.From.Name, r.Column.Type.Name)
	}
	return out
}

// BreakingChange is a schema change that would lose or rewrite values:
// a dropped, renamed, retyped or narrowed column, or a different key.
type BreakingChange struct {
	Table  string
	Column string
	// What happened: "dropped", "renamed", "retyped", "narrowed",
	// "widened" (refused by a contract's compatibility mode), "moved" (New
	// is the column it now follows) or "key".
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
	case "widened":
		return fmt.Sprintf("table %s: column %s widened from %s to %s", e.Table, e.Column, e.Old, e.New)
	case "moved":
		return fmt.Sprintf("table %s: column %s now follows %s, which it preceded: another column took its name (columns renamed into each other's names), or it was dropped and added again, with no change to the table between, and the change does not say which", e.Table, e.Column, e.New)
	}
	return fmt.Sprintf("table %s: the primary key changed from (%s) to (%s)", e.Table, e.Old, e.New)
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
