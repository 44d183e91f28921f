package pipeline

import (
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/warehouse"
)

// TestACheckpointStopsBelowABacklog: a checkpoint holds the lake's last
// event at most, and while a table released from parking has its
// changes from where it was parked still coming (no batch past its
// backlog is whole), it stops below them.
func TestACheckpointStopsBelowABacklog(t *testing.T) {
	plain := warehouse.Schema{Table: &change.Table{Schema: "public", Name: "a"}}
	released := warehouse.Schema{Table: &change.Table{Schema: "public", Name: "b", Backlog: &change.Backlog{From: 500, To: 900}}}
	for _, tc := range []struct {
		why                string
		bound, last, whole change.LSN
		newest             []warehouse.Schema
		want               change.LSN
	}{
		{"the lake's end", ^change.LSN(0), 800, 800, []warehouse.Schema{plain}, 800},
		{"a position before it", 700, 800, 800, []warehouse.Schema{plain}, 700},
		{"a backlog still coming", ^change.LSN(0), 800, 800, []warehouse.Schema{plain, released}, 499},
		{"a backlog with no whole batch yet", ^change.LSN(0), 800, 0, []warehouse.Schema{released}, 499},
		{"a backlog drained", ^change.LSN(0), 1000, 950, []warehouse.Schema{plain, released}, 1000},
	} {
		if got := checkpointAt(tc.bound, tc.last, tc.whole, tc.newest); got != tc.want {
			t.Errorf("%s: a checkpoint at %d, want %d", tc.why, got, tc.want)
		}
	}
}
