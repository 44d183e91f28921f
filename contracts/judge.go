package contracts

import (
	"fmt"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// Refusal is a source schema change that neither the table's
// compatibility mode nor its contract accepts; Hints say how to accept
// each change in the contract.
type Refusal struct {
	Changes []change.BreakingChange
	Hints   []string
}

func (r *Refusal) Error() string {
	var parts []string
	for i, c := range r.Changes {
		parts = append(parts, c.Error()+" ("+r.Hints[i]+")")
	}
	return strings.Join(parts, "; ")
}

// Judge decides a source schema change from prev to next under the
// table's contract c (nil: no contract, compatibility backward): what the
// compatibility mode evolves by itself, what the contract accepts because
// its columns already describe the new shape (a dropped column no longer
// listed, a renamed one listed with renamed_from, a retyped one with its
// new type), and what stops ingestion, as a *Refusal. A different primary
// key is never accepted: it needs a new history. accepted says that
// something beyond new columns and widened types was accepted.
func Judge(c *Contract, prev, next *change.Table) (d change.Diff, accepted bool, err error) {
	mode := Backward
	renames := map[string]string{}
	if c != nil {
		mode = c.Compatibility
		for _, col := range c.Columns {
			if col.RenamedFrom != "" && prev.Column(col.RenamedFrom) >= 0 && prev.Column(col.Name) < 0 && next.Column(col.Name) >= 0 {
				renames[col.Name] = col.RenamedFrom
			}
		}
	}
	moved := prev.Moved(next, renames)
	if len(moved) > 0 && c != nil {
		// A column that moved, listed as renamed from one that is gone:
		// the column that had its name was dropped (PostgreSQL's online
		// retype: add b_new, fill it, drop b, rename b_new to b).
		for _, m := range moved {
			if col := c.Column(m.Column); col != nil && col.RenamedFrom != "" && prev.Column(col.RenamedFrom) >= 0 && next.Column(col.RenamedFrom) < 0 {
				renames[m.Column] = col.RenamedFrom
			}
		}
		moved = prev.Moved(next, renames)
	}
	d = prev.Diff(next, renames)
	listed := func(name string, t change.Type) bool {
		if c == nil {
			return false
		}
		col := c.Column(name)
		return col != nil && sameType(col.parsed, t)
	}
	file := "contracts/" + change.SafeName(next.Name) + ".toml (lakeflow contracts init --table " + next.ID() + " writes it)"
	if c != nil {
		file = c.File
	}
	ref := &Refusal{}
	refuse := func(bc change.BreakingChange, hint string) {
		ref.Changes = append(ref.Changes, bc)
		ref.Hints = append(ref.Hints, hint)
	}
	for _, bc := range append(moved, d.Breaking(prev, next)...) {
		switch bc.What {
		case "moved":
			var gone []string
			for _, pc := range prev.Columns {
				if next.Column(pc.Name) < 0 {
					gone = append(gone, fmt.Sprintf("%q", pc.Name))
				}
			}
			hint := fmt.Sprintf("if the column %[1]s was renamed and a new %[1]s added, list the renamed column in %[2]s with renamed_from = %[1]q", bc.Column, file)
			if len(gone) > 0 {
				hint = fmt.Sprintf("if a column was renamed to %[1]s after the old %[1]s was dropped, list %[1]s in %[2]s with renamed_from = its old name (%[3]s is gone); ", bc.Column, file, strings.Join(gone, " or ")) + hint
			}
			refuse(bc, hint+"; otherwise lakeflow cannot follow it: run lakeflow resync "+next.ID()+", which copies the table again")
		case "key":
			refuse(bc, "a new primary key cannot be accepted: the table's history is keyed by the old one; capture it under a new source.slot")
		case "renamed":
			if _, ok := renames[bc.New]; ok || mode == None {
				accepted = true
				continue
			}
			if bc.Column != "" && prev.Column(bc.Old) >= 0 && next.Column(bc.New) >= 0 && c != nil && c.Column(bc.Old) == nil && listed(bc.New, next.Columns[next.Column(bc.New)].Type) {
				accepted = true // the contract drops the old column and adds the new
				continue
			}
			refuse(bc, fmt.Sprintf("accept it in %s: list the column as name = %q with renamed_from = %q, or, to keep both apart, remove %q and add %q", file, bc.New, bc.Old, bc.Old, bc.New))
		case "dropped":
			if _, taken := renames[bc.Column]; mode == None || taken || (c != nil && c.Column(bc.Column) == nil) {
				// (taken: a column the contract renames took its name.)
				accepted = true
				continue
			}
			refuse(bc, fmt.Sprintf("accept it in %s: remove the [[columns]] entry %q (silver keeps the column, NULL from here on)", file, bc.Column))
		case "narrowed", "retyped":
			col := next.Columns[next.Column(bc.Column)]
			if mode == None || (bc.What == "narrowed" && mode == Forward) || listed(bc.Column, col.Type) {
				accepted = true
				continue
			}
			refuse(bc, fmt.Sprintf("accept it in %s: set type = %q for column %q (silver converts the values it holds, if every one converts)", file, col.Type.Name, bc.Column))
		}
	}
	if mode == Forward || mode == Full {
		for _, w := range d.Widened {
			if listed(w.Column.Name, w.Column.Type) {
				accepted = true
				continue
			}
			refuse(change.BreakingChange{Table: prev.ID(), Column: w.Column.Name, What: "widened", Old: w.From.Name, New: w.Column.Type.Name},
				fmt.Sprintf("compatibility %s: accept it in %s: set type = %q for column %q", mode, file, w.Column.Type.Name, w.Column.Name))
		}
	}
	if len(ref.Changes) > 0 {
		return d, false, ref
	}
	return d, accepted, nil
}

// sameType reports whether a contract's type is the column's type, as
// silver holds it (spelling aside).
func sameType(a, b change.Type) bool {
	return a.Kind == b.Kind && a.Dims == b.Dims && a.Precision == b.Precision && a.Scale == b.Scale && a.Length == b.Length && a.Fixed == b.Fixed
}
