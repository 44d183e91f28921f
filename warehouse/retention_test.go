package warehouse

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/internal/config"
)

// TestPruneKeepsWhereTheWarehouseStands: lakeflow.batches' rows past the
// retention are summarized per hour and deleted, runs and checks deleted;
// the newest consistent batch stays however old (where the warehouse
// stands is read from it), and a summarized hour takes more of its
// batches later.
func TestPruneKeepsWhereTheWarehouseStands(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 7, 12, 30, 0, 0, time.UTC)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := f.wh.conn.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	// 240 batches an hour apart up to now, a third of them not
	// consistent; the newest consistent.
	for i := range 240 {
		at := now.Add(-time.Duration(239-i) * time.Hour)
		exec(`INSERT INTO lakeflow.batches VALUES (?, ?, ?, ?, ?, ?, ?)`, i+1, i%3 != 1, 1000+i, 1000+i, at.Add(-2*time.Second), i, at)
		exec(`INSERT INTO lakeflow.runs VALUES (?, ?, true, 0, 0, 0, 0, 0, NULL, 'done')`, at, at)
		exec(`INSERT INTO lakeflow.checks VALUES (?, 'data', 'c', 'warning', NULL, 1, NULL, NULL)`, at)
	}
	count := func(q string) string {
		t.Helper()
		var s string
		if err := f.wh.conn.QueryRowContext(ctx, q).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	p, err := f.wh.Prune(ctx, config.Bookkeeping{Batches: 168 * time.Hour, Runs: 48 * time.Hour, Checks: 24 * time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	// Batches older than 168 hours: the first 72 (at 239 down to 169
	// hours back, and 168 hours back is not older).
	if p.Batches != 71 || p.Runs != 191 || p.Checks != 215 {
		t.Fatalf("pruned %+v, want 71 batches, 191 runs, 215 checks", p)
	}
	expect(t, count("SELECT format('{} {} {} {} {} {}', count(*), sum(batches), sum(consistent), sum(events), min(first_batch), max(last_batch)) FROM lakeflow.batch_hours"),
		fmt.Sprintf("71 71 47 %d 1 71", 70*71/2))
	expect(t, count("SELECT format('{} {}', min(freshness_mean), max(freshness_max)) FROM lakeflow.batch_hours"), "2.0 2.0")
	if p, err = f.wh.Prune(ctx, config.Bookkeeping{Batches: 168 * time.Hour}, now); err != nil || p.Batches != 0 {
		t.Fatalf("a second prune: %+v, %v", p, err)
	}

	// A month later, idle since: every batch but the newest consistent
	// one is summarized. Then one more batch in its hour, and a prune
	// after the next: the hour adds it.
	later := now.Add(30 * 24 * time.Hour)
	if p, err = f.wh.Prune(ctx, config.Bookkeeping{Batches: time.Hour}, later); err != nil || p.Batches != 168 {
		t.Fatalf("the month-later prune: %+v, %v", p, err)
	}
	expect(t, count("SELECT string_agg(batch::VARCHAR, ',') FROM lakeflow.batches"), "240")
	exec(`INSERT INTO lakeflow.batches VALUES (241, true, 1240, 1240, NULL, 5, ?)`, now.Add(10*time.Minute))
	exec(`INSERT INTO lakeflow.batches VALUES (242, true, 1241, 1241, NULL, 1, ?)`, later)
	if p, err = f.wh.Prune(ctx, config.Bookkeeping{Batches: time.Hour}, later); err != nil || p.Batches != 2 {
		t.Fatalf("the prune after new batches: %+v, %v", p, err)
	}
	expect(t, count("SELECT format('{} {} {}', batches, events, last_batch) FROM lakeflow.batch_hours WHERE hour = '2026-12-07 12:00:00+00'"), "2 244 241")
	expect(t, count("SELECT format('{} {}', sum(batches), sum(events)) FROM lakeflow.batch_hours"), fmt.Sprintf("241 %d", 239*240/2+5))

	// Where the warehouse stands is as before.
	f.close()
	f.open()
	if f.wh.Floor() != 1241 || f.wh.batch != 242 {
		t.Fatalf("after pruning the warehouse stands at %s, batch %d: want 1241, 242", f.wh.Floor(), f.wh.batch)
	}
}
