package contracts

import "github.com/lakeflow/lakeflow/internal/change"

// Renames maps a contract's column names onto a table that has not taken
// the renames the contract accepts yet (the run stopped at the rename, or
// the contract accepts it ahead): each new name to its old one. Rules name
// the contract's columns; until the table takes a rename, they read the
// old column under the new name.
type Renames map[string]string

// Pending returns the renames c accepts that t has not taken yet (nil for
// none, or no contract).
func (c *Contract) Pending(t *change.Table) Renames {
	if c == nil {
		return nil
	}
	var r Renames
	for _, col := range c.Columns {
		if col.RenamedFrom != "" && t.Column(col.Name) < 0 && t.Column(col.RenamedFrom) >= 0 {
			if r == nil {
				r = Renames{}
			}
			r[col.Name] = col.RenamedFrom
		}
	}
	return r
}

// Column is the table's name for the contract's column col: its old name
// while its rename is pending; "" when the table has col only as the old
// name of a pending rename (the contract's col is then a column the table
// does not have yet).
func (r Renames) Column(col string) string {
	if old, ok := r[col]; ok {
		return old
	}
	for _, old := range r {
		if old == col {
			return ""
		}
	}
	return col
}

// Contract is the contract's name for the table's column col.
func (r Renames) Contract(col string) string {
	for name, old := range r {
		if old == col {
			return name
		}
	}
	return col
}
