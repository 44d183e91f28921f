package warehouse

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/internal/stage"
	"github.com/lakeflow/lakeflow/sql/gold"
)

// Publishing: the live warehouse is private to the process that writes
// it (DuckDB lets no other process open a file one writes, not even to
// read), so users query a copy at warehouse.path, renamed into place: a
// reader keeps the copy it opened, a new one gets the newest, and neither
// waits for the pipeline.
//
// A copy is the live file itself, checkpointed and copied byte for byte
// (the kernel copies it: 45 MB in about 20 ms), not an export: DuckDB's
// COPY FROM DATABASE decodes and encodes every row and rebuilds every
// key's index, 1.8 s of CPU for the same 45 MB, and under a steady load
// its copies every 5 s were 29% of lakeflow's CPU. Checkpoint and copy run
// between batches (Capture): a checkpoint rewrites the file, and a batch
// that updates rows waits for one running beside it anyway. The rest runs
// beside the stream (Copy.Publish: the marts' refresh, the copy's record,
// sync and rename). The copy is as large as the live
// file, and its free blocks hold what they held there (superseded
// versions of rows).

// ErrMidTransaction says a copy would have held part of a source
// transaction (its last batch was not consistent): none was published.
var ErrMidTransaction = errors.New("the last batch ends inside a source transaction")

// ErrGold says no copy was made because refreshing a gold mart failed:
// a mistake in its SQL or in the data it reads, which trying again does
// not mend (lakeflow run stops, as it did when the batch refreshed it).
var ErrGold = errors.New("publish: refresh gold marts")

// Publish copies the warehouse, as of its last committed batch, to path,
// atomically, with lakeflow.published saying which batch the copy holds,
// whether it ended at a source transaction boundary, and the source
// position of the last one that did. It must not overlap a batch.
func (w *Warehouse) Publish(ctx context.Context, path string) (*Copy, error) {
	c, err := w.Capture(ctx, path, false)
	if err != nil {
		return nil, err
	}
	return c, c.Publish(ctx)
}

// discard closes a connection of its own for good: a cancelled statement
// can leave it inside its transaction, so it never goes back to the pool.
func discard(conn *sql.Conn) {
	conn.Raw(func(any) error { return driver.ErrBadConn })
	conn.Close()
}

// Copy is a copy of the live warehouse under a temporary name beside the
// path it is published to. While it is being published, the warehouse
// must not be captured again, closed, or have RefreshDeferred run.
type Copy struct {
	w              *Warehouse
	path, tmp      string
	consistentOnly bool
	began          time.Time
	// conn is the copy's own connection. If marts wait for their refresh
	// (those refreshed with every batch, which DeferGold leaves to the
	// copies), it is inside a transaction Capture began between batches,
	// so it sees silver as the copy holds it.
	conn  *sql.Conn
	marts []*mart
	// batch is the live warehouse's last batch, which the copy holds.
	batch int64
	// Held is how long the checkpoint and the file's copy held batches
	// up; Gold, how long refreshing the marts took; Took, how long
	// publishing took in all but that; Batch is the batch the published
	// copy holds. (The refresh is the batches' work, moved: it is not
	// what the copy costs.)
	Held, Gold, Took time.Duration
	Batch            int64
	// Bytes is the copy's size; Cloned says the file system cloned the
	// live file (reflinks: XFS, btrfs) instead of copying its bytes.
	Bytes  int64
	Cloned bool
}

// Capture checkpoints the live warehouse (the file then holds every
// committed batch, its log nothing), copies the file beside path under a
// temporary name, and begins the transaction that refreshes the marts
// whose partitions wait for a copy, for Copy.Publish to finish beside
// the batches that follow. It must run between batches, from the
// goroutine that applies them. With consistentOnly, a copy whose last
// batch ends inside a source transaction is not published
// (ErrMidTransaction, from Copy.Publish).
func (w *Warehouse) Capture(ctx context.Context, path string, consistentOnly bool) (*Copy, error) {
	c := &Copy{w: w, path: path, tmp: fmt.Sprintf("%s.%d.publishing", path, os.Getpid()), consistentOnly: consistentOnly, began: time.Now()}
	if w.path == "" {
		return nil, errors.New("publish: an in-memory warehouse has no file to copy")
	}
	// Copies a killed process left half made (and their WAL) go first.
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		name := e.Name()
		if rest, ok := strings.CutPrefix(name, filepath.Base(path)+"."); ok && strings.Contains(rest, ".publishing") {
			if err := os.Remove(filepath.Join(filepath.Dir(path), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
			}
		}
	}
	if _, err := w.conn.ExecContext(ctx, "CHECKPOINT"); err != nil {
		if fault.DiskFull(err) {
			return nil, fmt.Errorf("%w: publish: checkpoint %s: %w (the batches committed are in its log: free space, then lakeflow run goes on)", fault.ErrEnvironment, w.path, err)
		}
		return nil, fmt.Errorf("publish: checkpoint %s: %w", w.path, err)
	}
	// No batch runs (DuckDB refuses a checkpoint while another
	// transaction writes): a log the checkpoint left would hold batches
	// the file does not.
	if fi, err := os.Stat(w.path + ".wal"); err == nil && fi.Size() > 0 {
		return nil, fmt.Errorf("publish: the checkpoint of %s left %d bytes in its log", w.path, fi.Size())
	}
	if c.Cloned, err = lake.Copy(w.path, c.tmp); err != nil {
		os.Remove(c.tmp)
		return nil, fmt.Errorf("publish %s: %w", path, err)
	}
	if fi, err := os.Stat(c.tmp); err == nil {
		c.Bytes = fi.Size()
	}
	// Every copy holds each mart as of its silver. Refreshed between
	// batches before the checkpoint, the marts held batches up for longer
	// than the checkpoint and the copy (a day's orders, recomputed:
	// 110-250 ms of each 250-650 ms hold-up under the bench's steady
	// load). Instead, the transaction begun now sees what the copy
	// holds, whatever batches commit while it runs, and writes only what
	// no batch writes (the marts refreshed with every batch, the
	// partitions that waited, and those marts' records).
	if c.conn, err = w.db.Conn(ctx); err != nil {
		os.Remove(c.tmp)
		return nil, err
	}
	c.batch = w.batch
	if err = exec(ctx, c.conn, slices.Concat(session, []string{"BEGIN TRANSACTION"})...); err == nil {
		c.marts, err = w.waiting(ctx, c.conn, (*mart).everyBatch)
	}
	if err == nil && len(c.marts) == 0 {
		_, err = c.conn.ExecContext(ctx, "ROLLBACK")
	}
	if err != nil {
		discard(c.conn)
		os.Remove(c.tmp)
		return nil, fmt.Errorf("publish: %w", err)
	}
	c.Held = time.Since(c.began)
	return c, nil
}

// refresh recomputes the marts that wait, in the transaction Capture
// began, and keeps the grain values each refreshed (copiedTable) for the
// copy to take them from the live warehouse once it has committed. A
// mart's SQL that fails is ErrGold; anything else may pass (a copy that
// fails is tried again later).
func (c *Copy) refresh(ctx context.Context) error {
	if len(c.marts) == 0 {
		return nil
	}
	t0 := time.Now()
	stage.Enter(stage.Gold)
	defer stage.Enter(stage.Publish)
	err := func() error {
		for i, m := range c.marts {
			if err := c.w.recompute(ctx, c.conn, m, nil); err != nil {
				return fmt.Errorf("%w: %w", ErrGold, err)
			}
			if err := exec(ctx, c.conn, fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS SELECT grain FROM lakeflow_refresh", copiedTable(i))); err != nil {
				return err
			}
		}
		return markRefreshed(ctx, c.conn, c.marts, c.batch)
	}()
	if err != nil {
		_, rerr := c.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return errors.Join(err, rerr)
	}
	if _, err := c.conn.ExecContext(context.WithoutCancel(ctx), "COMMIT"); err != nil {
		return fmt.Errorf("publish: commit the marts' refresh: %w", err)
	}
	c.Gold = time.Since(t0)
	return nil
}

// copiedTable holds the grain values the refresh of the copy's i-th
// waiting mart recomputed.
func copiedTable(i int) string { return fmt.Sprintf("lakeflow_copied_%d", i) }

// copyMarts puts the marts the copy's refresh recomputed into the copy
// (attached as lakeflow_publish): the partitions it recomputed, with the
// marts' records, from the live warehouse, where no batch has written
// them since (those marts are refreshed only for copies and between
// batches).
func copyMarts(ctx context.Context, conn *sql.Conn, marts []*mart) error {
	if len(marts) == 0 {
		return nil
	}
	stmts := []string{"BEGIN TRANSACTION"}
	for i, m := range marts {
		dst := "lakeflow_publish." + m.table()
		where := ""
		if m.Grain != gold.Full {
			where = fmt.Sprintf(" WHERE %s IN (SELECT grain FROM %s)", ident(m.Grain), copiedTable(i))
		}
		stmts = append(stmts, "DELETE FROM "+dst+where, fmt.Sprintf("INSERT INTO %s SELECT * FROM %s%s", dst, m.table(), where))
	}
	in := martNames(marts)
	stmts = append(stmts,
		fmt.Sprintf("DELETE FROM lakeflow_publish.lakeflow.gold_pending WHERE mart IN (%s)", in),
		fmt.Sprintf(`UPDATE lakeflow_publish.lakeflow.gold_marts AS p SET refreshed_at = l.refreshed_at, refreshed_batch = l.refreshed_batch
			FROM lakeflow.gold_marts AS l WHERE p.mart = l.mart AND p.mart IN (%s)`, in),
		"COMMIT")
	if err := exec(ctx, conn, stmts...); err != nil {
		_, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return errors.Join(err, rerr)
	}
	return nil
}

// Publish refreshes the marts that wait for the copy (a mart's SQL that
// fails is ErrGold), records in the copy which batch it holds
// (lakeflow.published), syncs it and renames it to its path. It runs on
// the copy's connection, so it may run beside Apply.
func (c *Copy) Publish(ctx context.Context) error {
	w, conn := c.w, c.conn
	defer discard(conn)
	if err := c.refresh(ctx); err != nil {
		os.Remove(c.tmp)
		return err
	}
	batch, consistent, err := markPublished(ctx, conn, c.tmp, c.marts)
	if _, derr := conn.ExecContext(context.WithoutCancel(ctx), "DETACH DATABASE IF EXISTS lakeflow_publish"); err == nil {
		err = derr
	}
	if err == nil && c.consistentOnly && !consistent {
		err = ErrMidTransaction
	}
	if err == nil {
		err = lake.Sync(c.tmp)
	}
	if err == nil {
		// DuckDB replays a log beside a file on open, whoever wrote it:
		// one an older lakeflow left there would corrupt every copy.
		if rerr := os.Remove(c.path + ".wal"); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
	}
	if err == nil {
		crash.Point(crash.Publishing)
		err = os.Rename(c.tmp, c.path)
	}
	if err == nil {
		err = lake.Sync(filepath.Dir(c.path))
	}
	if err != nil {
		os.Remove(c.tmp)
		os.Remove(c.tmp + ".wal")
		if errors.Is(err, ErrMidTransaction) {
			return err
		}
		return fmt.Errorf("publish %s: %w", c.path, err)
	}
	w.published.Store(batch)
	c.Batch, c.Took = batch, time.Since(c.began)-c.Gold
	return nil
}

// markPublished puts the refreshed marts into the copy at tmp
// (copyMarts), writes lakeflow.published into it, from the copy's own
// lakeflow.batches, and returns the batch the copy holds and whether it
// ends at a source transaction boundary. The caller detaches the copy.
func markPublished(ctx context.Context, conn *sql.Conn, tmp string, marts []*mart) (batch int64, consistent bool, err error) {
	// An attachment is the database instance's, not the connection's: one
	// a cancelled copy left goes first.
	err = exec(ctx, conn, "DETACH DATABASE IF EXISTS lakeflow_publish", "ATTACH "+literal(tmp)+" AS lakeflow_publish")
	if err == nil {
		err = copyMarts(ctx, conn, marts)
	}
	if err != nil {
		return 0, false, err
	}
	err = exec(ctx, conn,
		// (A live file made from a copy has one already.)
		`CREATE OR REPLACE TABLE lakeflow_publish.lakeflow.published AS
			SELECT coalesce(max(batch), 0) AS batch, coalesce(arg_max(consistent, batch), true) AS consistent,
				max(lsn) FILTER (consistent) AS _cdc_seq, arg_max(commit_ts, batch) FILTER (consistent) AS commit_ts, now() AS published_at
			FROM lakeflow_publish.lakeflow.batches`)
	if err != nil {
		return 0, false, err
	}
	err = conn.QueryRowContext(ctx, "SELECT batch, consistent FROM lakeflow_publish.lakeflow.published").Scan(&batch, &consistent)
	return batch, consistent, err
}

// exec runs statements on conn in order.
func exec(ctx context.Context, conn *sql.Conn, stmts ...string) error {
	for _, s := range stmts {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// Unpublished says batches committed after those the last published copy
// holds.
func (w *Warehouse) Unpublished() bool { return w.published.Load() != w.batch }

// Consistent says the last batch ended at a watermark: silver is the
// source as of one position, with no transaction in part.
func (w *Warehouse) Consistent() bool { return !w.midTransaction }

// Run is what one lakeflow run did, for lakeflow.runs.
type Run struct {
	Started, Ended                                time.Time
	Follow                                        bool
	Events, Batches, LakeFiles, Quarantined, Dead int64
	Phases                                        BatchStats
	ExitReason                                    string
}

// RecordRun appends a run to lakeflow.runs.
func (w *Warehouse) RecordRun(ctx context.Context, r Run) error {
	p := r.Phases
	_, err := w.conn.ExecContext(ctx, `INSERT INTO lakeflow.runs VALUES (?, ?, ?, ?, ?, ?, ?, ?,
		{'stage': ?, 'decode': ?, 'lake': ?, 'rules': ?, 'history': ?, 'merge': ?, 'gold': ?, 'commit': ?}, ?)`,
		r.Started, r.Ended, r.Follow, r.Events, r.Batches, r.LakeFiles, r.Quarantined, r.Dead,
		p.Stage.Seconds(), p.Decode.Seconds(), p.Lake.Seconds(), p.Rules.Seconds(), p.History.Seconds(), p.Merge.Seconds(), p.Gold.Seconds(), p.Commit.Seconds(),
		r.ExitReason)
	return err
}
