package change

import (
	"encoding/json"
	"testing"
)

// TestClonesShareNothing: a change to any part of a clone of a schema or
// of the source's state leaves the original as it was (the source and
// the warehouse each change or cache theirs in their own goroutine).
func TestClonesShareNothing(t *testing.T) {
	col := Column{Name: "id", Type: Type{Kind: KindInt4, Name: "integer"}, Key: true}
	table := &Table{Schema: "public", Name: "t", Columns: []Column{col}, Storage: []uint32{1}, Leaves: []uint32{2},
		Renames: map[string]string{"b": "a"}, Retired: []Column{col}, Formerly: []Former{{Column: "id", Name: "old"}},
		Reals: []Former{{Column: "r"}}, Backlog: &Backlog{From: 1, To: 2}}
	state := &SourceState{Slot: "s", Tables: []string{"public.t"}, SignedFrom: map[string]int64{"m": 1},
		Copies: []TableCopy{{Table: "public.t", After: []string{"7"}}}, Parked: []ParkedTable{{Table: "public.t"}}}
	unchanged := func(name string, v any, change func()) {
		t.Helper()
		before, _ := json.Marshal(v)
		change()
		if after, _ := json.Marshal(v); string(after) != string(before) {
			t.Errorf("changing the clone changed the original %s:\n%s\n%s", name, before, after)
		}
	}
	c := table.Clone()
	c.KeyColumns()
	unchanged("table", table, func() {
		c.Columns[0].Name, c.Storage[0], c.Leaves[0], c.Renames["b"] = "x", 9, 9, "x"
		c.Retired[0].Name, c.Formerly[0].Name, c.Reals[0].Column, c.Backlog.From = "x", "x", "x", 9
	})
	if table.keys != nil {
		t.Error("the clone's key cache is the original's")
	}
	s := state.Clone()
	unchanged("state", state, func() {
		s.Tables[0], s.SignedFrom["m"], s.Copies[0].After[0], s.Parked[0].Table = "x", 9, "x", "x"
	})
	if (*SourceState)(nil).Clone() != nil {
		t.Error("a nil state's clone is not nil")
	}
}
