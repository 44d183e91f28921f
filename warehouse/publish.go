package warehouse

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/fault"
	"github.com/lakeflow/lakeflow/pipeline/lake"
)

// Publishing: the live warehouse is private to the process that writes
// it (DuckDB lets no other process open a file one writes, not even to
// read), so users query a copy at warehouse.path, made between batches
// and renamed into place: a reader keeps the copy it opened, a new one
// gets the newest, and neither waits for the pipeline.

// ErrMidTransaction says a copy would have held part of a source
// transaction (its last batch was not consistent): PublishConsistent made
// none.
var ErrMidTransaction = errors.New("the last batch ends inside a source transaction")

// Publish copies the warehouse, as of its last committed batch, to path,
// atomically, with lakeflow.published saying which batch the copy holds,
// whether it ended at a source transaction boundary, and the source
// position of the last one that did; it returns how long that took.
//
// It copies on a connection of its own, in one transaction, so it may run
// beside Apply (a copy of a large warehouse takes seconds; the stream does
// not wait for it): the copy holds the batches committed when it began,
// and says which from its own lakeflow.batches. At most one Publish runs
// at a time.
func (w *Warehouse) Publish(ctx context.Context, path string) (time.Duration, error) {
	return w.publish(ctx, path, false)
}

// PublishConsistent is Publish, unless the last batch committed when the
// copy begins ends inside a source transaction: then it makes no copy and
// returns ErrMidTransaction.
func (w *Warehouse) PublishConsistent(ctx context.Context, path string) (time.Duration, error) {
	return w.publish(ctx, path, true)
}

func (w *Warehouse) publish(ctx context.Context, path string, consistentOnly bool) (time.Duration, error) {
	t0 := time.Now()
	tmp := fmt.Sprintf("%s.%d.publishing", path, os.Getpid())
	// Copies a killed process left half made (and their WAL) go first.
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		name := e.Name()
		if rest, ok := strings.CutPrefix(name, filepath.Base(path)+"."); ok && strings.Contains(rest, ".publishing") {
			if err := os.Remove(filepath.Join(filepath.Dir(path), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return 0, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
			}
		}
	}
	conn, err := w.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer func() {
		// Never back to the pool: a cancelled copy can leave the
		// connection inside its transaction.
		conn.Raw(func(any) error { return driver.ErrBadConn })
		conn.Close()
	}()
	background := context.WithoutCancel(ctx)
	batch, err := copyInto(ctx, conn, tmp, consistentOnly)
	if err != nil {
		conn.ExecContext(background, "ROLLBACK") // if a transaction is open
	}
	if _, derr := conn.ExecContext(background, "DETACH DATABASE IF EXISTS lakeflow_publish"); err == nil {
		err = derr
	}
	if err == nil {
		err = lake.Sync(tmp)
	}
	if err == nil {
		// DuckDB replays a log beside a file on open, whoever wrote it:
		// one an older lakeflow left there would corrupt every copy.
		if rerr := os.Remove(path + ".wal"); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = lake.Sync(filepath.Dir(path))
	}
	if err != nil {
		os.Remove(tmp)
		os.Remove(tmp + ".wal")
		if errors.Is(err, ErrMidTransaction) {
			return 0, err
		}
		return 0, fmt.Errorf("publish %s: %w", path, err)
	}
	w.published.Store(batch)
	return time.Since(t0), nil
}

// copyInto copies the database conn reads into a new file at tmp, in one
// transaction, with the lakeflow.published record, and returns the batch
// the copy holds. With consistentOnly, a snapshot whose last batch ends
// inside a source transaction is not copied (ErrMidTransaction). The
// caller rolls back and detaches.
func copyInto(ctx context.Context, conn *sql.Conn, tmp string, consistentOnly bool) (int64, error) {
	var db string
	if err := conn.QueryRowContext(ctx, "SELECT current_database()").Scan(&db); err != nil {
		return 0, err
	}
	// An attachment is the database instance's, not the connection's: one
	// a cancelled copy left goes first.
	err := exec(ctx, conn, "DETACH DATABASE IF EXISTS lakeflow_publish", "ATTACH "+literal(tmp)+" AS lakeflow_publish", "BEGIN TRANSACTION")
	if err != nil {
		return 0, err
	}
	consistent := true
	err = conn.QueryRowContext(ctx, "SELECT coalesce(arg_max(consistent, batch), true) FROM lakeflow.batches").Scan(&consistent)
	switch {
	case err != nil:
		return 0, err
	case consistentOnly && !consistent:
		return 0, ErrMidTransaction
	}
	err = exec(ctx, conn, fmt.Sprintf("COPY FROM DATABASE %s TO lakeflow_publish", ident(db)),
		// (A live file made from a copy has one already.)
		`CREATE OR REPLACE TABLE lakeflow_publish.lakeflow.published AS
			SELECT coalesce(max(batch), 0) AS batch, coalesce(arg_max(consistent, batch), true) AS consistent,
				max(lsn) FILTER (consistent) AS _cdc_seq, arg_max(commit_ts, batch) FILTER (consistent) AS commit_ts, now() AS published_at
			FROM lakeflow_publish.lakeflow.batches`)
	if err != nil {
		return 0, err
	}
	var batch int64
	if err := conn.QueryRowContext(ctx, "SELECT batch FROM lakeflow_publish.lakeflow.published").Scan(&batch); err != nil {
		return 0, err
	}
	return batch, exec(ctx, conn, "COMMIT")
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

// Unpublished says batches committed since the last Publish began.
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
