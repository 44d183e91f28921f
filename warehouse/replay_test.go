package warehouse

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
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

// namedRule is a contract rule that holds back the changes naming "bad".
const namedRule = `[[rules]]
name = "named"
check = "name <> 'bad'"
`

// TestReplayTellsApartEventsAtOneOffset: a lake that spans a reset Kafka
// log holds two events at one partition and offset; the replay judges
// each by itself, as the stream did, and gives the stream's quarantine
// and silver.
func TestReplayTellsApartEventsAtOneOffset(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	rules := namedRule
	f.withContract(rules)
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""), f.rec(change.OpCreate, 100, 2, "2", "bad", ""))
	f.apply(f.rec(change.OpUpdate, 200, 1, "1", "bad", ""), f.rec(change.OpUpdate, 200, 2, "2", "b", ""))
	// The second batch's file as a reset log would have written it: its
	// offsets start again at the first batch's.
	files, err := filepath.Glob(f.wh.lake.Abs(filepath.Join("acct", "*", "part-*.parquet")))
	if err != nil || len(files) != 2 {
		t.Fatalf("lake files %v (%v), want 2", files, err)
	}
	slices.Sort(files) // by their first position
	ctx := context.Background()
	reset := files[1] + ".reset"
	meta, err := f.wh.lakeMetadata(ctx, files[1:])
	if err != nil {
		t.Fatal(err)
	}
	var kv []string
	for k, v := range meta[files[1]] {
		kv = append(kv, literal(k)+": "+literal(v))
	}
	if _, err := f.wh.conn.ExecContext(ctx, fmt.Sprintf("COPY (SELECT * REPLACE (kafka_offset - 2 AS kafka_offset) FROM read_parquet(%s)) TO %s (FORMAT parquet, KV_METADATA {%s})",
		literal(files[1]), literal(reset), strings.Join(kv, ", "))); err != nil {
		t.Fatal(err)
	}
	var shared int
	if err := f.wh.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM (SELECT 1 FROM read_parquet([%s, %s]) GROUP BY kafka_partition, kafka_offset HAVING count(*) = 2)",
		literal(files[0]), literal(reset))).Scan(&shared); err != nil || shared != 2 {
		t.Fatalf("%d offsets held by both files (%v), want 2", shared, err)
	}
	if err := os.Rename(files[1]+".reset", files[1]); err != nil {
		t.Fatal(err)
	}
	want := f.silver() + "\n" + f.quarantine()
	if !strings.HasSuffix(want, `{"id":2} acct.named quarantine; {"id":1} acct.named quarantine`) {
		t.Fatalf("the stream gave %q, want each bad name held back", want)
	}
	for _, chunk := range []int{0, 2} {
		v := replayView(t, f, chunk, func(v *Warehouse) { (&fixture{t: t, wh: v}).withContract(rules) })
		r := &fixture{t: t, wh: v}
		got := r.silver() + "\n" + r.quarantine()
		v.Close()
		if got != want {
			t.Errorf("replay in chunks of %d events gave\n%s\nthe stream:\n%s", chunk, got, want)
		}
	}
}

// replayed is silver.acct rendered as fixture.silver does, rebuilt from
// f's lake in an in-memory warehouse, in chunks of about chunk events
// (0: one chunk).
func replayed(t *testing.T, f *fixture, chunk int) string {
	t.Helper()
	v := replayView(t, f, chunk, nil)
	defer v.Close()
	return (&fixture{t: t, wh: v}).silver()
}

// replayView is an in-memory warehouse rebuilt from f's lake, in chunks
// of about chunk events (0: one chunk), set up first by setup if given.
func replayView(t *testing.T, f *fixture, chunk int, setup func(*Warehouse)) *Warehouse {
	t.Helper()
	scope := ReplayScope{ChunkEvents: chunk}
	if chunk == 0 {
		scope.Upto = &Bound{Seq: ^change.LSN(0)}
	}
	return replayScoped(t, f, scope, setup)
}

// replayScoped is an in-memory warehouse rebuilt from f's lake in scope,
// set up first by setup if given.
func replayScoped(t *testing.T, f *fixture, scope ReplayScope, setup func(*Warehouse)) *Warehouse {
	t.Helper()
	v, _ := lakeView(t, f, "")
	if setup != nil {
		setup(v)
	}
	if _, err := v.Replay(context.Background(), scope); err != nil {
		t.Fatal(err)
	}
	return v
}

// lakeView is a warehouse at path ("": in memory) that reads f's lake,
// its tables made from the lake's schema versions, and the lake's state.
func lakeView(t *testing.T, f *fixture, path string) (*Warehouse, LakeState) {
	t.Helper()
	ctx := context.Background()
	v, err := OpenView(ctx, path, config.Warehouse{}, f.wh.lake, slog.New(slog.NewTextHandler(io.Discard, nil)), View{})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := v.ReadLakeState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.ApplyVersions(ctx, ls.Schemas, "lf._schemas"); err != nil {
		t.Fatal(err)
	}
	return v, ls
}

// TestReplayOfDaysHoldsTheirKeysWhole: the replay of a backfill of days
// applies the keys those days changed, each with all its history, and
// no other: their silver rows and quarantined changes are the stream's.
func TestReplayOfDaysHoldsTheirKeysWhole(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	rules := namedRule
	f.withContract(rules)
	// The fixture's commit time is a day's last second plus seq µs: from
	// seq 1,000,000 on, changes commit the next day, 2024-03-01.
	const next = 2_000_000
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""), f.rec(change.OpCreate, 100, 2, "2", "b", ""), f.rec(change.OpCreate, 100, 3, "3", "c", ""))
	f.apply(f.rec(change.OpUpdate, 200, 1, "2", "b2", ""), f.rec(change.OpUpdate, 300, 1, "1", "bad", ""))
	f.apply(f.rec(change.OpUpdate, next, 1, "1", "a2", ""), f.rec(change.OpCreate, next+100, 1, "4", "bad", ""), f.keyOnlyDelete(next+200, 1, "3"))
	var want []string
	for _, line := range strings.Split(f.silver(), "\n") {
		if strings.HasPrefix(line, "1 ") || strings.HasPrefix(line, "3 ") {
			want = append(want, line)
		}
	}
	wantHeld := f.quarantine()
	if len(want) != 2 || !strings.Contains(wantHeld, `{"id":4}`) {
		t.Fatalf("the stream gave silver\n%s\nand quarantine %s: want keys 1 and 3, and 4 held back", f.silver(), wantHeld)
	}
	day := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	for _, chunk := range []int{2, 1000} {
		v := replayScoped(t, f, ReplayScope{ChunkEvents: chunk, Days: &DayRange{From: day, To: day}}, func(v *Warehouse) { (&fixture{t: t, wh: v}).withContract(rules) })
		r := &fixture{t: t, wh: v}
		got, held := r.silver(), r.quarantine()
		v.Close()
		if got != strings.Join(want, "\n") || held != wantHeld {
			t.Errorf("replay of 2024-03-01 in chunks of %d events gave silver\n%s\nquarantine %s\nwant the stream's of keys 1 and 3 (not 2, which the day left alone):\n%s\n%s",
				chunk, got, held, strings.Join(want, "\n"), wantHeld)
		}
	}
}

// TestReplayOfDaysFollowsKeyChanges: a key changed before the days (a
// delete and a create in one transaction) that left a TOASTed value
// unchanged takes it from the key it moved from; the days' replay holds
// that key too, and the backfill's swap leaves silver as the stream gave
// it.
func TestReplayOfDaysFollowsKeyChanges(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	const next = 2_000_000 // seq: committed on 2024-03-01
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "long", ""))
	f.apply(f.keyOnlyDelete(200, 1, "1"), f.rec(change.OpCreate, 200, 2, "2", unchangedValue, ""))
	f.apply(f.rec(change.OpUpdate, next, 1, "2", unchangedValue, ""))
	stream := f.silver()
	want := "2 long ∅ @2000000/1"
	if !strings.Contains(stream, want) {
		t.Fatalf("the stream gave silver\n%s\nwant key 2 %q", stream, want)
	}
	day := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	for _, chunk := range []int{1, 1000} {
		v := replayScoped(t, f, ReplayScope{ChunkEvents: chunk, Days: &DayRange{From: day, To: day}}, nil)
		got := (&fixture{t: t, wh: v}).silver()
		v.Close()
		if !strings.Contains(got, want) {
			t.Errorf("replay of 2024-03-01 in chunks of %d events gave silver\n%s\nwant key 2 %q", chunk, got, want)
		}
	}
	shadow := filepath.Join(t.TempDir(), "shadow.duckdb")
	ctx := context.Background()
	v, err := OpenView(ctx, shadow, config.Warehouse{}, f.wh.lake, slog.New(slog.NewTextHandler(io.Discard, nil)), View{})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := v.ReadLakeState(ctx)
	if err == nil {
		err = v.ApplyVersions(ctx, ls.Schemas, "lf._schemas")
	}
	if err == nil {
		_, err = v.Replay(ctx, ReplayScope{ChunkEvents: 1000, Days: &DayRange{From: day, To: day}})
	}
	if cerr := v.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.wh.ReplaceSlice(ctx, shadow, day, day, ""); err != nil {
		t.Fatal(err)
	}
	if got := f.silver(); got != stream {
		t.Errorf("the backfill of 2024-03-01 changed silver from\n%s\nto\n%s", stream, got)
	}
}

// TestReplayOfDaysKnowsRenamedKeys: the keys the days changed are read
// under the key column's name then, before or after a rename.
func TestReplayOfDaysKnowsRenamedKeys(t *testing.T) {
	ctx := context.Background()
	day1, day2 := time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC), time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		from, to time.Time
		want     string
	}{{day1, day1, "1 a2, 2 b"}, {day2, day2, "1 a2"}, {day1, day2, "1 a2, 2 b"}} {
		f := newFixture(t)
		f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""), f.rec(change.OpCreate, 100, 2, "2", "b", ""))
		renamed := &change.Table{Schema: acct.Schema, Name: acct.Name, Accepted: true, Renames: map[string]string{"acct_id": "id"},
			Since:   change.Position{Seq: 1_500_000},
			Columns: []change.Column{{Name: "acct_id", Type: acct.Columns[0].Type, Key: true}, acct.Columns[1], acct.Columns[2]}}
		if err := f.wh.ApplySchemas(ctx, []Schema{{topic, renamed}}, "lf._schemas", schemaPos(2), nil, nil); err != nil {
			t.Fatal(err)
		}
		saved := acct
		acct = renamed
		f.apply(f.rec(change.OpUpdate, 2_000_000, 1, "1", "a2", ""))
		acct = saved
		v := replayScoped(t, f, ReplayScope{ChunkEvents: 1000, Days: &DayRange{From: tc.from, To: tc.to}}, nil)
		var got string
		if err := v.conn.QueryRowContext(ctx, "SELECT coalesce(string_agg(acct_id || ' ' || name, ', ' ORDER BY acct_id), '') FROM silver.acct").Scan(&got); err != nil {
			t.Fatal(err)
		}
		v.Close()
		f.close()
		if got != tc.want {
			t.Errorf("replay of %s to %s gave silver %q, want %q", tc.from.Format(time.DateOnly), tc.to.Format(time.DateOnly), got, tc.want)
		}
	}
}
