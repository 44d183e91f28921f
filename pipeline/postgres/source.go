package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/config"
	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// Sink receives the source's output in commit order; the Kafka producer
// implements it.
type Sink interface {
	// Schema records a table's schema durably before any event that
	// uses it.
	Schema(ctx context.Context, t *change.Table) error
	// Event hands over one event, which the sink encodes before returning.
	// It blocks only for backpressure. After a restart the sink drops
	// stream events it already holds.
	Event(ctx context.Context, ev *change.Event) error
	// EndTxn says every event handed over so far belongs to transactions
	// that end at or before end.
	EndTxn(end change.LSN)
	// Durable is the highest end LSN up to which everything is
	// acknowledged; only it may be confirmed to PostgreSQL.
	Durable() change.LSN
	// Flush waits until everything handed over is acknowledged.
	Flush(ctx context.Context) error
}

// StateStore keeps the source's state next to its output, so the two
// cannot disagree.
type StateStore interface {
	LoadState(ctx context.Context) (*State, error)
	SaveState(ctx context.Context, s State) error
	LoadSchemas(ctx context.Context) (map[string]*change.Table, error)
}

// State is what the source must remember across runs.
type State struct {
	Slot            string     `json:"slot"`
	ConsistentPoint change.LSN `json:"consistent_point"`
	// SnapshotTime (µs since the epoch) is the _commit_ts of snapshot rows.
	SnapshotTime int64 `json:"snapshot_time_us"`
	// Snapshotted is set once every snapshot row is acknowledged.
	Snapshotted bool     `json:"snapshotted"`
	Tables      []string `json:"tables"`
}

// SourceConfig configures a Source.
type SourceConfig struct {
	DSN         string
	Tables      []config.Table
	Slot        string
	Publication string
	Heartbeat   time.Duration
}

// Stats are the source's counters, safe to read while it runs.
type Stats struct {
	Events    atomic.Int64 // row events handed to the sink
	Txns      atomic.Int64 // transactions completed
	Received  atomic.Uint64
	ServerWAL atomic.Uint64 // the server's WAL end, from the stream
}

// Source captures a PostgreSQL database: the initial snapshot, then the
// logical replication stream.
type Source struct {
	cfg       SourceConfig
	log       *slog.Logger
	Stats     Stats
	streaming chan struct{}
	once      sync.Once
	// ignored are relations of tables dropped from source.tables whose
	// older changes are still in the WAL.
	ignored map[*change.Table]bool
}

// NewSource returns a Source; nothing connects until Run.
func NewSource(cfg SourceConfig, log *slog.Logger) *Source {
	return &Source{cfg: cfg, log: log, streaming: make(chan struct{}), ignored: map[*change.Table]bool{}}
}

// Streaming is closed once the snapshot is complete and the replication
// stream has started: from then on every change is captured as a change.
func (s *Source) Streaming() <-chan struct{} { return s.streaming }

// Run takes the snapshot if the slot has none yet, then streams changes
// into sink until ctx is cancelled or, once drain is closed, until all WAL
// written before that moment is delivered and acknowledged (nil).
// On cancel it waits for the sink to acknowledge what it holds, confirms
// that to PostgreSQL and returns ctx's error.
func (s *Source) Run(ctx context.Context, sink Sink, store StateStore, drain <-chan struct{}) error {
	conn, err := connect(ctx, s.cfg.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := preflight(ctx, conn, s.cfg.Tables); err != nil {
		return err
	}
	state, err := store.LoadState(ctx)
	if err != nil {
		return err
	}
	schemas, err := store.LoadSchemas(ctx)
	if err != nil {
		return err
	}
	slotExists, err := s.slotExists(ctx, conn)
	if err != nil {
		return err
	}
	streaming := state != nil && state.Snapshotted && state.Slot == s.cfg.Slot
	if err := ensurePublication(ctx, conn, s.cfg.Publication, s.cfg.Tables, streaming); err != nil {
		return err
	}
	switch {
	case streaming && !slotExists:
		return fmt.Errorf("%w: replication slot %s is gone (dropped, or invalidated by max_slot_wal_keep_size), so changes after %s cannot be read from the WAL any more; start over with a new source.slot and fresh topics, lake and warehouse",
			fault.ErrSource, s.cfg.Slot, state.ConsistentPoint)
	case streaming:
	case slotExists && (state == nil || state.Slot != s.cfg.Slot):
		return fmt.Errorf("%w: replication slot %s exists but lakeflow did not create it for these topics; drop it (SELECT pg_drop_replication_slot('%s')) or choose another source.slot",
			fault.ErrSource, s.cfg.Slot, s.cfg.Slot)
	default:
		// An earlier snapshot that did not finish may have delivered part
		// of its rows; the new one starts by resetting every table.
		redo := state != nil && state.Slot == s.cfg.Slot
		if redo {
			s.log.Warn("an earlier initial snapshot did not finish; starting it again", "slot", s.cfg.Slot)
		}
		if slotExists {
			if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s.cfg.Slot); err != nil {
				return fmt.Errorf("%w: drop unfinished slot %s: %v", fault.ErrSource, s.cfg.Slot, err)
			}
		}
		if state, err = s.snapshot(ctx, conn, sink, store, schemas, redo); err != nil {
			return err
		}
	}
	conn.Close(ctx)
	return s.stream(ctx, sink, state, schemas, drain)
}

func (s *Source) slotExists(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var plugin string
	err := conn.QueryRow(ctx, `SELECT plugin FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, s.cfg.Slot).Scan(&plugin)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var elsewhere bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, s.cfg.Slot).Scan(&elsewhere); err != nil {
			return false, fmt.Errorf("%w: read replication slots: %v", fault.ErrUnavailable, err)
		}
		if elsewhere {
			return false, fmt.Errorf("%w: replication slot %s belongs to another database; choose another source.slot", fault.ErrSource, s.cfg.Slot)
		}
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: read replication slots: %v", fault.ErrUnavailable, err)
	case plugin != "pgoutput":
		return false, fmt.Errorf("%w: replication slot %s uses plugin %s, not pgoutput; choose another source.slot", fault.ErrSource, s.cfg.Slot, plugin)
	}
	return true, nil
}

func (s *Source) tableNames() []string {
	names := make([]string, len(s.cfg.Tables))
	for i, t := range s.cfg.Tables {
		names[i] = t.String()
	}
	return names
}

// publishSchema records t if it is new or an additive change of what was
// recorded, and fails with fault.ErrSchemaBreak otherwise.
func (s *Source) publishSchema(ctx context.Context, sink Sink, schemas map[string]*change.Table, t *change.Table, at change.LSN) error {
	prev := schemas[t.ID()]
	if prev != nil && prev.Equal(t) {
		return nil
	}
	if prev != nil {
		added, err := prev.CheckEvolution(t)
		if err != nil {
			return fmt.Errorf("%w: %v; ingestion stopped at %s before writing any change of that transaction, and the slot stays there: revert the change in the source, or rebuild this table's history under a new source.slot",
				fault.ErrSchemaBreak, err, at)
		}
		names := make([]string, len(added))
		for i, c := range added {
			names[i] = c.Name + " " + c.Type.Name
		}
		s.log.Info("source table gained columns", "table", t.ID(), "added", names, "lsn", at)
	}
	if err := sink.Schema(ctx, t); err != nil {
		return err
	}
	schemas[t.ID()] = t
	return nil
}

func (s *Source) configured(id string) bool {
	for _, t := range s.cfg.Tables {
		if t.String() == id {
			return true
		}
	}
	return false
}
