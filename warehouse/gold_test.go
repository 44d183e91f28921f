package warehouse

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/sql/gold"
)

// byName counts acct's live rows per name.
const byName = `-- grain: name
-- touched by silver.acct: name
SELECT name, count(*) AS n
FROM silver.acct
WHERE NOT _deleted AND name IN (SELECT grain FROM lakeflow_refresh)
GROUP BY name
`

func (f *fixture) marts(files map[string]string, refresh map[string]config.Refresh) error {
	f.t.Helper()
	fsys := fstest.MapFS{}
	for name, text := range files {
		fsys[name] = &fstest.MapFile{Data: []byte(text)}
	}
	marts, err := gold.Load(fsys, "gold")
	if err != nil {
		return err
	}
	return f.wh.SetMarts(context.Background(), marts, refresh, []string{"acct"})
}

// gold renders a mart as "grain value rowid" lines.
func (f *fixture) gold(query string) string {
	f.t.Helper()
	var s string
	if err := f.wh.conn.QueryRowContext(context.Background(), "SELECT coalesce(string_agg(x, chr(10) ORDER BY x), '') FROM ("+query+") t(x)").Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

// TestRefreshRewritesTheTouchedPartitionsOnly: a batch that changes the
// rows of one name rewrites that name's row of the mart and no other
// (rowids stay), in both its old and its new partition.
func TestRefreshRewritesTheTouchedPartitionsOnly(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""), f.rec(change.OpCreate, 100, 2, "2", "b", ""),
		f.rec(change.OpCreate, 100, 3, "3", "c", ""), f.rec(change.OpCreate, 100, 4, "4", "c", ""))
	if err := f.marts(map[string]string{"by_name.sql": byName}, nil); err != nil {
		t.Fatal(err)
	}
	const rows = "SELECT name || ' ' || n || ' ' || rowid FROM gold.by_name"
	before := f.gold(rows)
	if before != "a 1 0\nb 1 1\nc 2 2" {
		t.Fatalf("gold.by_name built whole:\n%s", before)
	}
	f.apply(f.rec(change.OpUpdate, 200, 1, "4", "a", "")) // moves one row from c to a
	after := strings.Split(f.gold(rows), "\n")
	if len(after) != 3 || !strings.HasPrefix(after[0], "a 2 ") || after[1] != "b 1 1" || !strings.HasPrefix(after[2], "c 1 ") ||
		after[0] == "a 2 0" || after[2] == "c 1 2" {
		t.Fatalf("after the batch:\n%s\nwant b's row untouched (rowid 1), a's and c's rewritten (new rowids)", strings.Join(after, "\n"))
	}
	f.apply(f.rec(change.OpDelete, 300, 1, "2", "b", ""), f.rec(change.OpCreate, 300, 2, "5", "d", ""))
	if got, want := f.gold("SELECT name || ' ' || n FROM gold.by_name"), "a 2\nc 1\nd 1"; got != want {
		t.Fatalf("after a delete and an insert:\n%s\nwant:\n%s", got, want)
	}
}

// TestMartThatFailsOnSilverIsTheUsersToFix: a mart whose SQL binds but
// fails on what silver holds (here a name that is not a number; after a
// rename, a column silver no longer has) stops the batch as a
// configuration error naming the mart's file, not as lakeflow's failure.
func TestMartThatFailsOnSilverIsTheUsersToFix(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	const asNumber = `-- grain: name
-- touched by silver.acct: name
SELECT name, CAST(name AS INTEGER) AS n
FROM silver.acct
WHERE NOT _deleted AND name IN (SELECT grain FROM lakeflow_refresh)
`
	if err := f.marts(map[string]string{"as_number.sql": asNumber}, nil); err != nil {
		t.Fatal(err)
	}
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "7", ""))
	_, err := f.wh.Apply(context.Background(), batch(f.rec(change.OpCreate, 200, 1, "2", "seven", "")))
	if !errors.Is(err, fault.ErrConfig) || !strings.Contains(err.Error(), "gold/as_number.sql") || !strings.Contains(err.Error(), "seven") {
		t.Fatalf("got %v, want a configuration error naming gold/as_number.sql and the value", err)
	}
}

// TestManualAndIntervalMartsWait: a manual mart is refreshed only when
// asked; its touched partitions wait in lakeflow.gold_pending.
func TestManualAndIntervalMartsWait(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	if err := f.marts(map[string]string{"by_name.sql": byName}, map[string]config.Refresh{"by_name": {Manual: true}}); err != nil {
		t.Fatal(err)
	}
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""))
	if got := f.gold("SELECT name FROM gold.by_name"); got != "" {
		t.Fatalf("a manual mart was refreshed by a batch: %q", got)
	}
	if got := f.gold("SELECT mart || ' ' || grain FROM lakeflow.gold_pending"); got != "by_name a" {
		t.Fatalf("pending partitions %q", got)
	}
}

// TestBadMartsAreRefusedWithFileAndLine: each mistake names the file and
// line; a mart reading a table that is not captured is skipped.
func TestBadMartsAreRefusedWithFileAndLine(t *testing.T) {
	for name, tc := range map[string]struct{ text, want string }{
		"parse":          {"-- grain: name\n-- touched by silver.acct: name\nSELECT name\nFROM WHERE silver.acct\n", "gold/m.sql:4: syntax error"},
		"missing column": {"-- grain: name\n-- touched by silver.acct: name\nSELECT name,\n  nme AS n\nFROM silver.acct\n", "gold/m.sql:4: Binder Error"},
		"no touched":     {"-- grain: name\nSELECT name FROM silver.acct\n", `it reads silver.acct but says nothing`},
		"no grain":       {"SELECT name FROM silver.acct\n", `lacks "-- grain`},
		"grain column":   {"-- grain: nom\n-- touched by silver.acct: name\nSELECT name FROM silver.acct\n", "grain nom is not a column"},
		"not silver":     {"-- grain: full\nSELECT * FROM lakeflow.batches\n", "reads silver tables only"},
		"bad touched":    {"-- grain: name\n-- touched by silver.acct: nme\nSELECT name FROM silver.acct\n", "gold/m.sql:2: Binder Error"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			defer f.close()
			err := f.marts(map[string]string{"m.sql": tc.text}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
			if name != "no grain" && !errors.Is(err, fault.ErrConfig) {
				t.Fatalf("want a configuration error, got %v", err)
			}
		})
	}
	f := newFixture(t)
	defer f.close()
	if err := f.marts(map[string]string{"m.sql": "-- grain: full\nSELECT * FROM silver.other\n"}, nil); err != nil {
		t.Fatalf("a mart over a table that is not captured: want it skipped, got %v", err)
	}
}

// TestIntervalMartsRefreshWhenDue: a mart refreshed hourly keeps the
// partitions batches touch pending until it is due, or the run drains.
func TestIntervalMartsRefreshWhenDue(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""))
	if err := f.marts(map[string]string{"by_name.sql": byName}, map[string]config.Refresh{"by_name": {Every: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	f.apply(f.rec(change.OpCreate, 200, 1, "2", "a", ""))
	if got := f.gold("SELECT name || ' ' || n FROM gold.by_name"); got != "a 1" {
		t.Fatalf("refreshed before it was due: %q", got)
	}
	if err := f.wh.RefreshDue(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if got := f.gold("SELECT name || ' ' || n FROM gold.by_name"); got != "a 1" {
		t.Fatalf("refreshed before it was due: %q", got)
	}
	if err := f.wh.RefreshDue(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if got := f.gold("SELECT name || ' ' || n FROM gold.by_name"); got != "a 2" {
		t.Fatalf("a drained run refreshes what waits: %q", got)
	}
}

// TestMartsSeeDeletesWithTheKeyAlone: a batch of an update and deletes
// that carry only the key refreshes the partitions the deleted rows left,
// for a table with an interval and one without (they took different
// paths through the merge until 2026-12-03).
func TestMartsSeeDeletesWithTheKeyAlone(t *testing.T) {
	withInterval := acct
	defer func() { acct = withInterval }()
	withoutInterval := &change.Table{Schema: "public", Name: "acct", Columns: []change.Column{
		{Name: "id", Type: change.Type{Kind: change.KindInt4, Name: "integer"}, Key: true},
		{Name: "name", Type: change.Type{Kind: change.KindText, Name: "text"}},
		{Name: "span", Type: change.Type{Kind: change.KindText, Name: "text"}},
	}}
	for path, table := range map[string]*change.Table{"interval": withInterval, "text": withoutInterval} {
		t.Run(path, func(t *testing.T) {
			acct = table
			f := newFixture(t)
			defer f.close()
			f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""), f.rec(change.OpCreate, 100, 2, "2", "b", ""),
				f.rec(change.OpCreate, 100, 3, "3", "b", ""))
			if err := f.marts(map[string]string{"by_name.sql": byName}, nil); err != nil {
				t.Fatal(err)
			}
			f.apply(f.rec(change.OpUpdate, 200, 1, "1", "c", ""), f.keyOnlyDelete(200, 2, "1"), f.keyOnlyDelete(200, 3, "2"))
			if got, want := f.gold("SELECT name || ' ' || n FROM gold.by_name"), "b 1"; got != want {
				t.Fatalf("gold.by_name:\n%s\nwant:\n%s", got, want)
			}
			expect(t, f.silver(), `
1 c ∅ deleted @200/2
2 b ∅ deleted @200/3
3 b ∅ @100/3`)
		})
	}
}

// TestDeferredMartsWaitForTheCopy: with DeferGold, a mart refreshed with
// every batch keeps the partitions batches touch pending, and
// RefreshDeferred (which a run calls as it stops) brings it up to silver
// as of the last committed batch.
func TestDeferredMartsWaitForTheCopy(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""))
	if err := f.marts(map[string]string{"by_name.sql": byName}, nil); err != nil {
		t.Fatal(err)
	}
	f.wh.DeferGold()
	f.apply(f.rec(change.OpCreate, 200, 1, "2", "a", ""), f.rec(change.OpCreate, 200, 2, "3", "b", ""))
	if got := f.gold("SELECT name || ' ' || n FROM gold.by_name"); got != "a 1" {
		t.Fatalf("a deferred mart was refreshed by its batch: %q", got)
	}
	if got := f.gold("SELECT DISTINCT mart || ' ' || grain FROM lakeflow.gold_pending"); got != "by_name a\nby_name b" {
		t.Fatalf("pending partitions %q", got)
	}
	took, err := f.wh.RefreshDeferred(context.Background())
	if err != nil || took == 0 {
		t.Fatalf("RefreshDeferred: %v, %v", took, err)
	}
	if got := f.gold("SELECT name || ' ' || n FROM gold.by_name"); got != "a 2\nb 1" {
		t.Fatalf("refreshed: %q", got)
	}
	if got := f.gold("SELECT mart || ' ' || grain FROM lakeflow.gold_pending") + f.gold("SELECT refreshed_batch::VARCHAR FROM lakeflow.gold_marts"); got != "2" {
		t.Fatalf("pending partitions and the batch recorded: %q, want none and batch 2", got)
	}
	if took, err := f.wh.RefreshDeferred(context.Background()); err != nil || took != 0 {
		t.Fatalf("nothing waits: RefreshDeferred %v, %v", took, err)
	}
}

// TestCopyRefreshesMartsAsOfItsSilver: the marts that wait for a copy are
// recomputed as the copy holds silver, though a batch commits between the
// copy's capture and its refresh; the copy holds them so, and the live
// warehouse keeps that batch's partitions pending for the next copy.
func TestCopyRefreshesMartsAsOfItsSilver(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	ctx := context.Background()
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""))
	if err := f.marts(map[string]string{"by_name.sql": byName}, nil); err != nil {
		t.Fatal(err)
	}
	f.wh.DeferGold()
	f.apply(f.rec(change.OpCreate, 200, 1, "2", "a", ""), f.rec(change.OpCreate, 200, 2, "3", "b", ""))
	path := filepath.Join(f.dir, "published.duckdb")
	c, err := f.wh.Capture(ctx, path, false)
	if err != nil {
		t.Fatal(err)
	}
	f.apply(f.rec(change.OpUpdate, 300, 1, "1", "c", ""), f.rec(change.OpCreate, 300, 2, "4", "b", ""))
	if err := c.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Gold == 0 || c.Batch != 2 {
		t.Errorf("the copy holds batch %d, its marts refreshed in %v; want batch 2, a refresh", c.Batch, c.Gold)
	}
	db, err := sql.Open("duckdb", path+"?access_mode=READ_ONLY")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var copied string
	err = db.QueryRow(`SELECT (SELECT string_agg(name || ' ' || n, chr(10) ORDER BY name) FROM gold.by_name)
		|| ' | ' || (SELECT count(*) FROM lakeflow.gold_pending) || ' | ' || (SELECT refreshed_batch FROM lakeflow.gold_marts)`).Scan(&copied)
	if err != nil || copied != "a 2\nb 1 | 0 | 2" {
		t.Fatalf("the copy's mart, pending partitions and refreshed batch: %q (%v), want them as of batch 2", copied, err)
	}
	if got := f.gold("SELECT name || ' ' || n FROM gold.by_name"); got != "a 2\nb 1" {
		t.Errorf("the live mart: %q, want it as of batch 2", got)
	}
	if got := f.gold("SELECT DISTINCT grain FROM lakeflow.gold_pending"); got != "a\nb\nc" {
		t.Errorf("the live pending partitions: %q, want batch 3's", got)
	}
	if _, err := f.wh.RefreshDeferred(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.gold("SELECT name || ' ' || n FROM gold.by_name"); got != "a 1\nb 2\nc 1" {
		t.Errorf("the live mart refreshed: %q", got)
	}
}
