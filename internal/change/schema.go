package change

import (
	"maps"
	"slices"
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
	Name string `json:"name"`
	// Dims is the number of array dimensions (0: not an array). PostgreSQL
	// does not enforce it; it is the column's declared dimensions.
	Dims int `json:"dims,omitempty"`
	// Precision and Scale are set for constrained numeric; Precision 0
	// means unconstrained.
	Precision int `json:"precision,omitempty"`
	Scale     int `json:"scale,omitempty"`
	// Length is the declared length of varchar(n) and char(n); 0 means
	// unbounded. Fixed marks char(n), whose values are padded to it.
	Length int  `json:"length,omitempty"`
	Fixed  bool `json:"fixed,omitempty"`
}

// IsArray reports whether the type is an array type.
func (t Type) IsArray() bool { return t.Dims > 0 }

// Toastable reports whether PostgreSQL may store the type's values out
// of line (TOAST): an update that leaves such a value as it was may not
// log it (Datum.Unchanged). Fixed-size types never are.
func (t Type) Toastable() bool {
	switch t.Kind {
	case KindText, KindBytea, KindNumeric, KindJSON, KindJSONB, KindOther:
		return true
	}
	return t.IsArray()
}

// Column is one source column.
type Column struct {
	Name string `json:"name"`
	Type Type   `json:"type"`
	Key  bool   `json:"key,omitempty"`
	// Fill is set when the column was added with a constant DEFAULT:
	// PostgreSQL gives the rows that existed then that value without
	// rewriting them, so no change event carries it.
	Fill Fill `json:"fill,omitzero"`
	// Dropped is where the source dropped a retired column.
	Dropped Position `json:"dropped,omitzero"`
}

// Fill is the value rows that predate a column have in it. Events before
// the position Before were written without the column; their rows hold
// the value there.
type Fill struct {
	Before Position `json:"before"`
	// Null, or Text in PostgreSQL's text output format.
	Null bool   `json:"null,omitempty"`
	Text string `json:"text,omitempty"`
}

// Set reports whether the column has a fill value.
func (f Fill) Set() bool { return f.Before.Seq != 0 }

// Table is the schema of one captured table as lakeflow last saw it.
// Columns must not change after first use.
type Table struct {
	Schema  string   `json:"schema"`
	Name    string   `json:"table"`
	Columns []Column `json:"columns"`
	// Storage identifies the relations that hold the rows (relfilenodes
	// of the table or its leaf partitions): it changes when PostgreSQL
	// rewrites the table. Leaves are those relations' OIDs, in the same
	// order (a partition created or dropped is no rewrite); schemas
	// recorded before 2026-12-07 have none.
	Storage []uint32 `json:"storage,omitempty"`
	Leaves  []uint32 `json:"leaves,omitempty"`
	// Since is the position this schema took effect at: events from there
	// on have its columns.
	Since Position `json:"since"`
	// Accepted says the change from the previous schema was not only
	// columns added and types widened, and the table's contract accepted
	// it; Renames (new name → old name) are the renames it accepted.
	Accepted bool              `json:"accepted,omitempty"`
	Renames  map[string]string `json:"renames,omitempty"`
	// Retired are columns the source dropped that silver keeps (NULL for
	// changes from their Dropped position on).
	Retired []Column `json:"retired,omitempty"`
	// Formerly are the names columns had before the source renamed them:
	// changes still in Kafka when silver followed a rename carry the old
	// name (the warehouse keeps these, as it keeps Retired).
	Formerly []Former `json:"formerly,omitempty"`
	// Reals are columns widened from real to double precision (Column,
	// Before; no Name): a change made before Before carries the value as
	// PostgreSQL prints a real, which reads as PostgreSQL's own exact
	// conversion only through a FLOAT (read as a double, 0.6666667 is
	// not the float4 0.6666666865348816 PostgreSQL's rewrite keeps).
	Reals []Former `json:"reals,omitempty"`
	// Backlog, set on the schema of a table that was parked (a change of
	// its shape waited for a contract edit or a resync), says that its
	// changes with positions from Backlog.From to Backlog.To arrive after
	// the warehouse went past them with the other tables: they are not
	// stale.
	Backlog *Backlog `json:"backlog,omitempty"`
	keys    []int
}

// Backlog is the span of a released table's changes that are read from
// the WAL again: From is where the table was parked, To the WAL's end
// when it was released.
type Backlog struct {
	From LSN `json:"from"`
	To   LSN `json:"to"`
}

// Former is a name a column had: events before Before carry Column under
// Name, or, with no Name, do not carry it (it did not exist; another
// column had its name).
type Former struct {
	Column string   `json:"column"`
	Name   string   `json:"name,omitempty"`
	Before Position `json:"before"`
}

// ID is the table's qualified name, as source.tables spells it
// (QualifiedName).
func (t *Table) ID() string { return QualifiedName(t.Schema, t.Name) }

// KeyColumns returns the indexes of the primary-key columns, in order.
// It is called per event, so the answer is kept.
func (t *Table) KeyColumns() []int {
	if t.keys == nil {
		// Built whole, then kept: a goroutine that reads it meanwhile
		// sees none (and builds its own), never part of it.
		keys := []int{}
		for i, c := range t.Columns {
			if c.Key {
				keys = append(keys, i)
			}
		}
		t.keys = keys
	}
	return t.keys
}

// Clone returns a copy of t that shares nothing with it: a schema handed
// to another goroutine must not share the key cache KeyColumns writes.
func (t *Table) Clone() *Table {
	c := *t
	c.Columns = slices.Clone(t.Columns)
	c.Storage, c.Leaves = slices.Clone(t.Storage), slices.Clone(t.Leaves)
	c.Renames = maps.Clone(t.Renames)
	c.Retired = slices.Clone(t.Retired)
	c.Formerly, c.Reals = slices.Clone(t.Formerly), slices.Clone(t.Reals)
	if t.Backlog != nil {
		b := *t.Backlog
		c.Backlog = &b
	}
	c.keys = nil
	return &c
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
