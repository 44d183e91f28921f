package change

import (
	"fmt"
)

// Kind is the family of a PostgreSQL type, which decides how its values are
// written into the envelope and which DuckDB type holds them.
type Kind string

// Kinds lakeflow maps faithfully; every other type travels as its text
// (KindText semantics) under KindOther.
const (
	KindInt2        Kind = "int2"
	KindInt4        Kind = "int4"
	KindInt8        Kind = "int8"
	KindFloat4      Kind = "float4"
	KindFloat8      Kind = "float8"
	KindNumeric     Kind = "numeric"
	KindMoney       Kind = "money"
	KindBool        Kind = "bool"
	KindText        Kind = "text"
	KindBytea       Kind = "bytea"
	KindDate        Kind = "date"
	KindTime        Kind = "time"
	KindTimeTZ      Kind = "timetz"
	KindTimestamp   Kind = "timestamp"
	KindTimestampTZ Kind = "timestamptz"
	KindInterval    Kind = "interval"
	KindUUID        Kind = "uuid"
	KindJSON        Kind = "json"
	KindJSONB       Kind = "jsonb"
	KindOther       Kind = "other"
)

// Type is a column's type as the pipeline needs it.
type Type struct {
	Kind Kind `json:"kind"`
	// Name is PostgreSQL's own spelling, e.g. "numeric(12,2)" or "integer[]".
	Name  string `json:"name"`
	Array bool   `json:"array,omitempty"`
	// Precision and Scale are set for constrained numeric; Precision 0
	// means unconstrained.
	Precision int `json:"precision,omitempty"`
	Scale     int `json:"scale,omitempty"`
}

// Column is one source column.
type Column struct {
	Name string `json:"name"`
	Type Type   `json:"type"`
	Key  bool   `json:"key,omitempty"`
}

// Table is the schema of one captured table as lakeflow last saw it.
// Columns must not change after first use.
type Table struct {
	Schema  string   `json:"schema"`
	Name    string   `json:"table"`
	Columns []Column `json:"columns"`
	keys    []int
}

// ID is schema.table.
func (t *Table) ID() string { return t.Schema + "." + t.Name }

// KeyColumns returns the indexes of the primary-key columns, in order.
// It is called per event, so the answer is kept.
func (t *Table) KeyColumns() []int {
	if t.keys == nil {
		t.keys = []int{}
		for i, c := range t.Columns {
			if c.Key {
				t.keys = append(t.keys, i)
			}
		}
	}
	return t.keys
}

// Column returns the index of the named column, or -1.
func (t *Table) Column(name string) int {
	for i, c := range t.Columns {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// Equal reports whether two schemas are identical.
func (t *Table) Equal(u *Table) bool {
	if t.Schema != u.Schema || t.Name != u.Name || len(t.Columns) != len(u.Columns) {
		return false
	}
	for i := range t.Columns {
		if t.Columns[i] != u.Columns[i] {
			return false
		}
	}
	return true
}

// BreakingChange describes a schema change that lakeflow cannot apply
// without rewriting history: a dropped, renamed or retyped column, or a
// different primary key.
type BreakingChange struct {
	Table  string
	Reason string
}

func (e *BreakingChange) Error() string {
	return fmt.Sprintf("table %s: %s", e.Table, e.Reason)
}

// CheckEvolution accepts next as the successor of t when it only appends
// new nullable-compatible columns (additive change) and returns the added
// columns. Anything else is a *BreakingChange.
func (t *Table) CheckEvolution(next *Table) ([]Column, error) {
	brk := func(format string, args ...any) error {
		return &BreakingChange{Table: t.ID(), Reason: fmt.Sprintf(format, args...)}
	}
	for _, old := range t.Columns {
		i := next.Column(old.Name)
		if i < 0 {
			return nil, brk("column %s was dropped or renamed", old.Name)
		}
		nc := next.Columns[i]
		if nc.Type != old.Type {
			return nil, brk("column %s changed type from %s to %s", old.Name, old.Type.Name, nc.Type.Name)
		}
		if nc.Key != old.Key {
			return nil, brk("primary key changed (column %s)", old.Name)
		}
	}
	var added []Column
	for i, c := range next.Columns {
		if i < len(t.Columns) {
			if c.Name != t.Columns[i].Name {
				return nil, brk("columns were reordered at %s", c.Name)
			}
			continue
		}
		if c.Key {
			return nil, brk("primary key changed (new key column %s)", c.Name)
		}
		added = append(added, c)
	}
	return added, nil
}
