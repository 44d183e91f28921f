package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// slotCreateTimeout bounds CREATE_REPLICATION_SLOT, which waits for every
// transaction that holds an xid to finish.
const slotCreateTimeout = 2 * time.Minute

// snapshot creates the slot and copies every table inside the snapshot the
// slot exports, so snapshot plus stream is exactly the database: no gap,
// no overlap. Snapshot rows carry (consistent point, 0).
//
// Each table is read in key order, and state.Copies keeps the tables not
// finished, with the last key Kafka holds (saved every snapshotSaveRows
// rows): a run killed meanwhile resumes under the same slot, copying what
// is left while the stream runs from the consistent point (resumeSnapshot).
//
// A redo follows a snapshot that did not finish: the rows it delivered are
// in Kafka, and a key among them may since have been deleted, which no
// stream event will say. So each table first gets a truncate just before
// the new consistent point: consumers drop what they knew, then take the
// complete snapshot.
func (s *Source) snapshot(ctx context.Context, conn *pgx.Conn, sink Sink, store StateStore, schemas map[string]*change.Table, redo bool) (*change.SourceState, error) {
	state := &change.SourceState{Slot: s.cfg.Slot, Tables: s.tableNames(), Key: s.cfg.Key}
	for _, id := range state.Tables {
		state.Copies = append(state.Copies, change.TableCopy{Table: id})
	}
	// Saved before the slot exists, so a crash right after creating it
	// still leaves a record that the slot is ours to drop.
	if err := store.SaveState(ctx, *state); err != nil {
		return nil, err
	}
	repl, res, err := s.createSlot(ctx, "EXPORT_SNAPSHOT")
	if err != nil {
		return nil, err
	}
	defer repl.Close(context.Background())
	cp, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return nil, fmt.Errorf("slot consistent point %q: %w", res.ConsistentPoint, err)
	}
	state.ConsistentPoint = change.LSN(cp)
	if redo {
		// Resumed as copies, the tables the truncates did not reach yet
		// reconcile instead: silver's rows from before the new slot that
		// no copy writes again are gone from the source.
		for i := range state.Copies {
			state.Copies[i].Reconcile, state.Copies[i].Since = true, state.ConsistentPoint
		}
	}

	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("%w: begin snapshot transaction: %v", fault.ErrUnavailable, err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+res.SnapshotName+"'"); err != nil {
		return nil, fmt.Errorf("%w: import snapshot %s: %v", fault.ErrSource, res.SnapshotName, err)
	}
	// Key order from the key's index, never a sort of a whole table
	// into temporary files.
	if _, err := tx.Exec(ctx, "SET LOCAL enable_sort = off"); err != nil {
		return nil, fmt.Errorf("%w: snapshot settings: %v", fault.ErrUnavailable, err)
	}
	// The copy has imported the snapshot; the exporting session may go.
	repl.Close(ctx)
	var taken time.Time
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&taken); err != nil {
		return nil, fmt.Errorf("%w: read snapshot time: %v", fault.ErrUnavailable, err)
	}
	state.SnapshotTime = taken.UnixMicro()
	if err := store.SaveState(ctx, *state); err != nil {
		return nil, err
	}
	s.log.Info("initial snapshot started", "slot", s.cfg.Slot, "consistent_point", state.ConsistentPoint)
	cat := newCatalog(conn)
	var rows int64
	defer s.Stats.Snapshot.Store(nil)
	for i, ct := range s.cfg.Tables {
		rel, err := cat.relationByName(ctx, ct.Schema, ct.Name)
		var t *change.Table
		if err == nil {
			t, err = cat.table(ctx, rel, rel.snapshotColumns(), nil)
		}
		if err != nil && transient(err) {
			return nil, fmt.Errorf("%w: %v (the next lakeflow run goes on from where it stopped)", fault.ErrUnavailable, err)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", fault.ErrSource, err)
		}
		if err := s.publishSchema(ctx, sink, schemas, t, rel, change.Position{Seq: state.ConsistentPoint}, true); err != nil {
			return nil, err
		}
		if redo {
			reset := change.Event{Table: t, Op: change.OpTruncate, LSN: state.ConsistentPoint, Commit: state.SnapshotTime,
				Pos: change.Position{Seq: state.ConsistentPoint - 1, Ord: 1}, Snapshot: change.SnapshotNone}
			if err := sink.Event(ctx, &reset); err != nil {
				return nil, err
			}
		}
		p := &SnapshotProgress{Table: t.ID(), Index: i + 1, Count: len(s.cfg.Tables), Estimate: -1, Started: time.Now()}
		// An estimate for the progress display (-1 when never analyzed).
		tx.QueryRow(ctx, "SELECT reltuples::bigint FROM pg_class WHERE oid = $1", rel.oid).Scan(&p.Estimate)
		s.Stats.Snapshot.Store(p)
		n, err := s.copyTable(ctx, tx, sink, store, t, state, &p.Rows)
		if err != nil {
			return nil, err
		}
		if err := sink.Flush(ctx); err != nil {
			return nil, err
		}
		state.Copies = state.Copies[1:]
		if err := store.SaveState(ctx, *state); err != nil {
			return nil, err
		}
		s.log.Info("table snapshotted", "table", t.ID(), "rows", n, "seconds", time.Since(p.Started).Round(time.Millisecond).Seconds())
		rows += n
		crash.Point(crash.Snapshot)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("%w: end snapshot transaction: %v", fault.ErrUnavailable, err)
	}
	sink.EndTxn(change.Boundary{Seq: state.ConsistentPoint, End: state.ConsistentPoint, Commit: state.SnapshotTime})
	if err := sink.Flush(ctx); err != nil {
		return nil, err
	}
	state.Snapshotted = true
	if err := store.SaveState(ctx, *state); err != nil {
		return nil, err
	}
	s.log.Info("initial snapshot done", "tables", len(s.cfg.Tables), "rows", rows)
	return state, nil
}

// createSlot creates the slot; action is CREATE_REPLICATION_SLOT's
// snapshot action. The connection returned holds an exported snapshot
// until it is closed.
func (s *Source) createSlot(ctx context.Context, action string) (*pgconn.PgConn, pglogrepl.CreateReplicationSlotResult, error) {
	var res pglogrepl.CreateReplicationSlotResult
	repl, err := connectReplication(ctx, s.cfg.DSN)
	if err != nil {
		return nil, res, err
	}
	cctx, cancel := context.WithTimeout(ctx, slotCreateTimeout)
	res, err = pglogrepl.CreateReplicationSlot(cctx, repl, s.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{SnapshotAction: action})
	cancel()
	if err != nil {
		repl.Close(context.Background())
		if errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, res, fmt.Errorf("%w: creating replication slot %s waited %s for open transactions to finish (%s); end them and retry",
				fault.ErrSource, s.cfg.Slot, slotCreateTimeout, s.openTransactions(ctx))
		}
		return nil, res, fmt.Errorf("%w: create replication slot %s: %v", fault.ErrSource, s.cfg.Slot, err)
	}
	return repl, res, nil
}

// snapshotSaveRows is how many rows of a table the snapshot copies between
// two saves of its progress.
const snapshotSaveRows = 200_000

// copyTable copies t, the table state.Copies[0] names, in key order.
func (s *Source) copyTable(ctx context.Context, tx pgx.Tx, sink Sink, store StateStore, t *change.Table, state *change.SourceState, done *atomic.Int64) (int64, error) {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	var keys []string
	for _, i := range t.KeyColumns() {
		keys = append(keys, cols[i])
	}
	ev := change.Event{
		Table: t, Op: change.OpRead, LSN: state.ConsistentPoint, Commit: state.SnapshotTime,
		Pos: change.Position{Seq: state.ConsistentPoint}, Snapshot: change.SnapshotRow,
	}
	var n int64
	r := newCopyReader(len(t.Columns), func(row []change.Datum) error {
		ev.After = row
		n++
		s.Stats.Events.Add(1)
		done.Add(1)
		if err := sink.Event(ctx, &ev); err != nil {
			return err
		}
		if n%snapshotSaveRows != 0 {
			return nil
		}
		// Everything up to this row in Kafka: a restart goes on after it.
		if err := sink.Flush(ctx); err != nil {
			return err
		}
		state.Copies[0].After, state.Copies[0].Rows = keyText(t, row), n
		if err := store.SaveState(ctx, *state); err != nil {
			return err
		}
		s.log.Debug("snapshot progress saved", "table", t.ID(), "rows", n)
		return nil
	})
	query := fmt.Sprintf("COPY (SELECT %s FROM %s ORDER BY %s) TO STDOUT", strings.Join(cols, ", "), pgx.Identifier{t.Schema, t.Name}.Sanitize(), strings.Join(keys, ", "))
	if _, err := tx.Conn().PgConn().CopyTo(ctx, r, query); err != nil {
		if transient(err) {
			return n, fmt.Errorf("%w: snapshot %s: %v (the next lakeflow run goes on from where it stopped)", fault.ErrUnavailable, t.ID(), err)
		}
		return n, fmt.Errorf("snapshot %s: %w", t.ID(), err)
	}
	if err := r.finish(); err != nil {
		return n, fmt.Errorf("snapshot %s: %w", t.ID(), err)
	}
	return n, nil
}

// openTransactions names the sessions that block slot creation.
func (s *Source) openTransactions(ctx context.Context) string {
	conn, err := connect(ctx, s.cfg.DSN)
	if err != nil {
		return "could not list them"
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `
		SELECT format('pid %s (%s, %s, open since %s)', pid, usename, state, xact_start)
		FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()`)
	if err != nil {
		return "could not list them"
	}
	list, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(list) == 0 {
		return "none listed now"
	}
	return strings.Join(list, "; ")
}
