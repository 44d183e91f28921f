package warehouse

import (
	"context"
	"fmt"
	"time"

	"github.com/lakeflow/lakeflow/internal/config"
)

// Pruned is what Prune removed from the bookkeeping tables.
type Pruned struct {
	Batches, Runs, Checks int64
}

// Prune bounds the bookkeeping tables by age, as keep says, in one
// transaction: lakeflow.batches' rows older than keep.Batches are
// summarized per hour into lakeflow.batch_hours and deleted (the newest
// consistent batch and those after it stay: where the warehouse stands is
// read from them), lakeflow.runs' and lakeflow.checks' older rows deleted.
// A long-running pipeline's bookkeeping so grows with its retention, not
// with its age.
func (w *Warehouse) Prune(ctx context.Context, keep config.Bookkeeping, now time.Time) (Pruned, error) {
	var p Pruned
	tx, err := w.conn.BeginTx(ctx, nil)
	if err != nil {
		return p, err
	}
	defer tx.Rollback()
	before := func(d time.Duration) string { return fmt.Sprintf("make_timestamptz(%d)", now.Add(-d).UnixMicro()) }
	old := fmt.Sprintf(`committed_at < %s AND batch < (SELECT coalesce(max(batch) FILTER (consistent), 0) FROM lakeflow.batches)`, before(keep.Batches))
	if keep.Batches > 0 {
		// An hour summarized before gains what is summarized now (its
		// batches kept then as the newest consistent one, since
		// overtaken).
		if _, err := tx.ExecContext(ctx, `INSERT INTO lakeflow.batch_hours
			SELECT date_trunc('hour', committed_at), count(*), count(*) FILTER (consistent), sum(events), min(batch), max(batch),
				avg(epoch(committed_at) - epoch(commit_ts)) FILTER (consistent AND commit_ts IS NOT NULL),
				max(epoch(committed_at) - epoch(commit_ts)) FILTER (consistent AND commit_ts IS NOT NULL)
			FROM lakeflow.batches WHERE `+old+` GROUP BY 1
			ON CONFLICT (hour) DO UPDATE SET
				freshness_mean = CASE WHEN excluded.freshness_mean IS NULL THEN freshness_mean
					WHEN freshness_mean IS NULL THEN excluded.freshness_mean
					ELSE (freshness_mean * consistent + excluded.freshness_mean * excluded.consistent) / (consistent + excluded.consistent) END,
				freshness_max = greatest(freshness_max, excluded.freshness_max),
				batches = batches + excluded.batches, consistent = consistent + excluded.consistent, events = events + excluded.events,
				first_batch = least(first_batch, excluded.first_batch), last_batch = greatest(last_batch, excluded.last_batch)`); err != nil {
			return p, fmt.Errorf("summarize lakeflow.batches: %w", err)
		}
	}
	del := func(table, where string, n *int64) error {
		res, err := tx.ExecContext(ctx, fmt.Sprintf("DELETE FROM lakeflow.%s WHERE %s", table, where))
		if err != nil {
			return fmt.Errorf("prune lakeflow.%s: %w", table, err)
		}
		*n, err = res.RowsAffected()
		return err
	}
	for _, d := range []struct {
		table, where string
		keep         time.Duration
		n            *int64
	}{
		{"batches", old, keep.Batches, &p.Batches},
		{"runs", "ended_at < " + before(keep.Runs), keep.Runs, &p.Runs},
		{"checks", "checked_at < " + before(keep.Checks), keep.Checks, &p.Checks},
	} {
		if d.keep > 0 {
			if err := del(d.table, d.where, d.n); err != nil {
				return p, err
			}
		}
	}
	return p, tx.Commit()
}
