package warehouse

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/config"
)

// TestReplayOfDeletesMatchesTheStream: replaying the lake into a new
// warehouse, in one chunk or in many, gives the silver the stream gave
// for deletes with the key alone (which keep the key's last live version,
// from the same batch or an earlier one), deletes with the full row, and
// keys deleted and inserted again; on the MERGE path and on the path of
// tables with an interval column.
func TestReplayOfDeletesMatchesTheStream(t *testing.T) {
	plain := &change.Table{Schema: "public", Name: "acct", Columns: []change.Column{
		{Name: "id", Type: change.Type{Kind: change.KindInt4, Name: "integer"}, Key: true},
		{Name: "name", Type: change.Type{Kind: change.KindText, Name: "text"}},
		{Name: "span", Type: change.Type{Kind: change.KindText, Name: "text"}},
	}}
	for _, tc := range []struct {
		path  string
		table *change.Table
		span  string
	}{{"merge", plain, "x"}, {"interval", acct, "P1D"}} {
		t.Run(tc.path, func(t *testing.T) {
			saved := acct
			defer func() { acct = saved }()
			acct = tc.table
			f := newFixture(t)
			defer f.close()
			f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", tc.span), f.rec(change.OpCreate, 100, 2, "2", "b", ""),
				f.rec(change.OpCreate, 100, 3, "3", "c", tc.span), f.rec(change.OpCreate, 100, 4, "5", "e", ""))
			f.apply(f.rec(change.OpUpdate, 200, 1, "1", "a2", tc.span), f.keyOnlyDelete(300, 1, "1"),
				f.keyOnlyDelete(300, 2, "3"), f.rec(change.OpCreate, 400, 1, "3", "c2", ""),
				f.rec(change.OpDelete, 400, 2, "5", "e", ""))
			f.apply(f.keyOnlyDelete(500, 1, "2"), f.keyOnlyDelete(500, 2, "4"))
			want := f.silver()
			if want == "" {
				t.Fatal("the stream left silver empty")
			}
			for _, chunk := range []int{0, 2} {
				if got := replayed(t, f, chunk); got != want {
					t.Fatalf("replay in chunks of %d events gave silver:\n%s\nthe stream's:\n%s", chunk, got, want)
				}
			}
		})
	}
}

// replayed is silver.acct rendered as fixture.silver does, rebuilt from
// f's lake in an in-memory warehouse, in chunks of about chunk events
// (0: one chunk).
func replayed(t *testing.T, f *fixture, chunk int) string {
	t.Helper()
	ctx := context.Background()
	v, err := OpenView(ctx, "", config.Warehouse{}, f.wh.lake, slog.New(slog.NewTextHandler(io.Discard, nil)), View{})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	ls, err := v.ReadLakeState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.ApplyVersions(ctx, ls.Schemas, "lf._schemas"); err != nil {
		t.Fatal(err)
	}
	scope := ReplayScope{ChunkEvents: chunk}
	if chunk == 0 {
		scope.Upto = &Bound{Seq: ^change.LSN(0)}
	}
	if _, err := v.Replay(ctx, scope); err != nil {
		t.Fatal(err)
	}
	return (&fixture{t: t, wh: v}).silver()
}
