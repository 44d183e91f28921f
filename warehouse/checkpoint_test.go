package warehouse

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// TestACheckpointFitsOnlyItsInputs: a replay that starts from a state
// checkpoint and replays the events after it gives the stream's silver;
// a checkpoint of another lakeflow build, other contracts, other columns
// or a later position is not loaded, and leaves the replay's state empty.
func TestACheckpointFitsOnlyItsInputs(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	defer f.close()
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""), f.rec(change.OpCreate, 100, 2, "2", "b", ""), f.rec(change.OpCreate, 100, 3, "3", "c", ""))
	f.apply(f.rec(change.OpUpdate, 200, 1, "1", "a2", ""), f.keyOnlyDelete(200, 2, "2"))
	f.apply(f.rec(change.OpUpdate, 300, 1, "3", "c2", ""), f.rec(change.OpCreate, 300, 2, "2", "b2", ""), f.keyOnlyDelete(300, 3, "1"))
	want := f.silver()

	view := func(path string) (*Warehouse, CheckpointInputs) {
		t.Helper()
		v, ls := lakeView(t, f, path)
		return v, InputsOf(nil, ls.Schemas)
	}
	// The checkpoint: the replay up to the second batch.
	path := filepath.Join(t.TempDir(), "cp.duckdb")
	b, in := view(path)
	at := Bound{Seq: 200}
	if _, err := b.Replay(ctx, ReplayScope{Upto: &at}); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteCheckpointManifest(ctx, at, in); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	v, in := view("")
	from, unfit, err := v.LoadCheckpoint(ctx, path, in, ^change.LSN(0))
	if err != nil || unfit != "" || from != at.Seq {
		t.Fatalf("the checkpoint of the same inputs: at %d, unfit %q, %v", from, unfit, err)
	}
	st, err := v.Replay(ctx, ReplayScope{From: from})
	if err != nil {
		t.Fatal(err)
	}
	if got := (&fixture{t: t, wh: v}).silver(); got != want || st.Events != 3 {
		t.Errorf("the replay of %d events after the checkpoint gave silver\n%s\nthe stream's:\n%s", st.Events, got, want)
	}
	v.Close()

	for _, tc := range []struct {
		why    string
		change func(v *Warehouse, in *CheckpointInputs)
		upto   change.LSN
		want   string
	}{
		{"another build", func(_ *Warehouse, in *CheckpointInputs) { in.Build += "+fix" }, ^change.LSN(0), "another lakeflow build"},
		{"other contracts", func(_ *Warehouse, in *CheckpointInputs) { in.Contracts = "other" }, ^change.LSN(0), "the contracts changed"},
		{"another schema", func(_ *Warehouse, in *CheckpointInputs) { in.Tables["public.acct"] = "other" }, ^change.LSN(0), "the schema of public.acct changed"},
		{"other columns", func(v *Warehouse, _ *CheckpointInputs) {
			if _, err := v.conn.ExecContext(ctx, "ALTER TABLE silver.acct ADD COLUMN flag BOOLEAN DEFAULT false"); err != nil {
				t.Fatal(err)
			}
		}, ^change.LSN(0), "silver.acct has other columns"},
		{"a later position", func(*Warehouse, *CheckpointInputs) {}, 150, "after the position"},
	} {
		v, in := view("")
		tc.change(v, &in)
		_, unfit, err := v.LoadCheckpoint(ctx, path, in, tc.upto)
		var n int
		if qerr := v.conn.QueryRowContext(ctx, "SELECT count(*) FROM silver.acct").Scan(&n); qerr != nil {
			t.Fatal(qerr)
		}
		if err != nil || !strings.Contains(unfit, tc.want) || n != 0 {
			t.Errorf("a checkpoint of %s: unfit %q, %v, %d rows loaded; want %q and none", tc.why, unfit, err, n, tc.want)
		}
		v.Close()
	}
}

// TestAViewReadsOnByLinks: a view that reads the lake by links of the
// files it listed lets go of the swap lock (a compaction may swap the
// days at once), and replays the stream's silver with the lake's own
// files gone.
func TestAViewReadsOnByLinks(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""), f.rec(change.OpCreate, 100, 2, "2", "b", ""))
	f.apply(f.rec(change.OpUpdate, 200, 1, "1", "a2", ""), f.keyOnlyDelete(200, 2, "2"))
	want := f.silver()
	v, _ := lakeView(t, f, "")
	defer v.Close()
	if _, err := f.wh.lake.LockSwaps(false); !errors.Is(err, lake.ErrReadersHold) {
		t.Fatalf("a view that listed the lake does not hold it: %v", err)
	}
	if err := v.ReadByLinks(filepath.Join(t.TempDir(), "links")); err != nil {
		t.Fatal(err)
	}
	unlock, err := f.wh.lake.LockSwaps(false)
	if err != nil {
		t.Fatalf("a view that reads by links still holds the lake: %v", err)
	}
	unlock()
	if err := os.RemoveAll(f.wh.lake.Abs("acct")); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Replay(context.Background(), ReplayScope{}); err != nil {
		t.Fatal(err)
	}
	if got := (&fixture{t: t, wh: v}).silver(); got != want {
		t.Errorf("the view read by links gave silver\n%s\nthe stream's:\n%s", got, want)
	}
}
