package postgres

import (
	"context"
	"log/slog"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
)

// savedStates is a StateStore that keeps what it is given.
type savedStates struct{ saved []change.SourceState }

func (s *savedStates) LoadState(context.Context) (*change.SourceState, error) { return nil, nil }
func (s *savedStates) SaveState(_ context.Context, st change.SourceState) error {
	s.saved = append(s.saved, st)
	return nil
}
func (s *savedStates) LoadSchemas(context.Context) (map[string]*change.Table, error) { return nil, nil }

// TestReleasedTableSettlesPastItsRelease: a released table holds the slot
// before where it was parked until downstream has applied a boundary
// past the WAL's end at the release. At that end exactly it has not:
// before the stream reads the WAL again, everything durable is there, and
// the table's changes are not in it yet.
func TestReleasedTableSettlesPastItsRelease(t *testing.T) {
	store := &savedStates{}
	s := NewSource(SourceConfig{}, slog.New(slog.DiscardHandler))
	s.store = store
	s.state = &change.SourceState{Parked: []change.ParkedTable{
		{Table: "public.t", At: change.Position{Seq: 100, Ord: 1}, Released: 500},
		{Table: "public.u", At: change.Position{Seq: 300, Ord: 1}},
	}}
	if got := s.parkedLimit(1000); got != 99 {
		t.Fatalf("the slot may be confirmed to %s, want 0/63 (before the first parked change)", got)
	}
	if err := s.settleParked(context.Background(), 500); err != nil || len(s.state.Parked) != 2 || len(store.saved) != 0 {
		t.Fatalf("settled at the release's own position: %v, %+v", err, s.state.Parked)
	}
	if err := s.settleParked(context.Background(), 501); err != nil || len(s.state.Parked) != 1 || len(store.saved) != 1 {
		t.Fatalf("not settled past the release: %v, %+v", err, s.state.Parked)
	}
	if got := s.parkedLimit(1000); got != 299 {
		t.Fatalf("the slot may be confirmed to %s once t settled, want before u's change", got)
	}
	if p := s.Parked(); len(p) != 1 || p[0].Table != "public.u" {
		t.Fatalf("Parked() = %+v, want u alone (released tables are not parked)", p)
	}
}
