package contracts

import (
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
)

// TestRenamesMapTheContractOntoTheTable: a rename the table has not taken
// maps the new name to the old; a column the contract adds under the old
// name is not the old column; a rename already taken, or from a column
// the table lacks, maps nothing.
func TestRenamesMapTheContractOntoTheTable(t *testing.T) {
	tb := &change.Table{Columns: []change.Column{{Name: "id"}, {Name: "b"}, {Name: "done"}}}
	c := &Contract{Columns: []Column{{Name: "id"}, {Name: "bb", RenamedFrom: "b"}, {Name: "b"},
		{Name: "done", RenamedFrom: "todo"}, {Name: "x", RenamedFrom: "nothing"}}}
	r := c.Pending(tb)
	for col, want := range map[string]string{"id": "id", "bb": "b", "b": "", "done": "done", "x": "x"} {
		if got := r.Column(col); got != want {
			t.Errorf("Column(%q) = %q, want %q", col, got, want)
		}
	}
	if got := r.Contract("b"); got != "bb" {
		t.Errorf("Contract(b) = %q, want bb", got)
	}
	if (*Contract)(nil).Pending(tb) != nil {
		t.Error("no contract, yet renames")
	}
}
