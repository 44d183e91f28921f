package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
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
	// EndTxn says every event handed over so far is at or before b.
	EndTxn(b change.Boundary)
	// Durable is the highest end LSN up to which everything is
	// acknowledged; only it may be confirmed to PostgreSQL.
	Durable() change.LSN
	// Flush waits until everything handed over is acknowledged.
	Flush(ctx context.Context) error
	// Track says t's topic may hold events no watermark bounds yet (a
	// process stopped after handing them over, before its watermark):
	// the next boundary's bounds cover them. Events of a copy or of a
	// snapshot the source goes on from are not handed over again, as a
	// stream's are.
	Track(ctx context.Context, t *change.Table) error
}

// StateStore keeps the source's state next to its output, so the two
// cannot disagree.
type StateStore interface {
	LoadState(ctx context.Context) (*change.SourceState, error)
	SaveState(ctx context.Context, s change.SourceState) error
	LoadSchemas(ctx context.Context) (map[string]*change.Table, error)
}

// SourceConfig configures a Source.
type SourceConfig struct {
	DSN         string
	Tables      []config.Table
	Slot        string
	Publication string
	Heartbeat   time.Duration
	// BufferBytes bounds the WAL bytes received but not yet handed to the
	// sink (default 64 MiB): a transaction of huge rows waits in
	// PostgreSQL, not in memory.
	BufferBytes int64
	// Applied, if set, is the end LSN up to which everything downstream of
	// the sink (the warehouse) has durably applied: the slot is confirmed
	// only up to it, so a Kafka that loses its data can be refilled from
	// the WAL.
	Applied func() change.LSN
	// Delivered is a position downstream already holds every event up
	// to: stream events at or before it are not handed over again.
	Delivered change.LSN
	// Fallback is the state the warehouse kept, used when the store has
	// none (the Kafka data was deleted, or the topic prefix changed).
	Fallback *change.SourceState
	// FallbackSchemas are the table schemas the warehouse holds, used
	// when the store has none.
	FallbackSchemas map[string]*change.Table
	// Contracts decide which schema changes evolve by themselves and
	// accept the others.
	Contracts contracts.Set
	// Key is the pipeline's key (kafka.Signer) for a state the snapshot
	// makes.
	Key string
	// Resyncs brings requests to copy tables again (lakeflow resync);
	// they are taken once the stream runs, those buffered before it
	// starts first. One for every table (Tables nil) is also the way
	// out of a lost slot.
	Resyncs <-chan Resync
	// ContractEdits brings the contracts again when their files change
	// (lakeflow run --follow): a table parked for a change they now
	// accept is released.
	ContractEdits <-chan contracts.Set
}

// Stats are the source's counters, safe to read while it runs.
type Stats struct {
	Events    atomic.Int64 // row events handed to the sink
	Received  atomic.Uint64
	ServerWAL atomic.Uint64 // the server's WAL end, from the stream
	// Confirmed is the position last confirmed to the server: the slot
	// holds the WAL from there to ServerWAL.
	Confirmed atomic.Uint64
	// Buffered is the WAL bytes received and not yet handed over;
	// BufferedPeak its highest value.
	Buffered, BufferedPeak atomic.Int64
	// Snapshot is the table the initial snapshot copies now (nil outside
	// a snapshot).
	Snapshot atomic.Pointer[SnapshotProgress]
	// Copy is the table copied while the stream runs now (nil: none).
	Copy atomic.Pointer[CopyProgress]
}

// CopyProgress is where a copy while the stream runs stands: the rows
// copied so far, of the copies still to make.
type CopyProgress struct {
	Table string
	Rows  atomic.Int64
	Left  int // copies after this one
}

// SnapshotProgress is where the initial snapshot stands in one table.
type SnapshotProgress struct {
	Table        string
	Index, Count int   // the table's place among the captured ones (1-based)
	Estimate     int64 // rows pg_class.reltuples estimates (-1: unknown)
	Rows         atomic.Int64
	Started      time.Time
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
	// older changes are still in the WAL; skipped, the tables whose
	// changes were said to be skipped.
	ignored map[*change.Table]bool
	skipped map[string]bool
	copies  copies
	// held are resyncs taken from cfg.Resyncs before the stream ran.
	held []Resync
	// state is the source's state once it streams (its copies are read
	// under stateMu).
	state *change.SourceState
	store StateStore
	// stateMu orders changes of the state's copies, and their saving,
	// between the copier and the stream's goroutine; it guards parkedNow
	// and cfg.Contracts too.
	stateMu sync.Mutex
	// parkedNow are the tables parked in this stream session, with the
	// shape that was refused: their changes are skipped.
	parkedNow map[string]*change.Table
}

// NewSource returns a Source; nothing connects until Run.
func NewSource(cfg SourceConfig, log *slog.Logger) *Source {
	if cfg.BufferBytes <= 0 {
		cfg.BufferBytes = 64 << 20
	}
	return &Source{cfg: cfg, log: log, streaming: make(chan struct{}),
		ignored: map[*change.Table]bool{}, skipped: map[string]bool{}, parkedNow: map[string]*change.Table{}}
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
	s.store = store
	state, err := store.LoadState(ctx)
	if err != nil {
		return err
	}
	schemas, err := store.LoadSchemas(ctx)
	if err != nil {
		return err
	}
	// Kafka lost the schema history the warehouse holds: it is recorded
	// again below, so the Relation messages PostgreSQL re-sends are judged
	// against what silver has (and replays as replays).
	restore := len(schemas) == 0 && len(s.cfg.FallbackSchemas) > 0
	if restore {
		schemas = maps.Clone(s.cfg.FallbackSchemas)
	}
	gone, err := preflight(ctx, conn, s.cfg.Tables, func(id string) bool { return schemas[id] != nil }, s.log)
	if err != nil {
		return err
	}
	if state == nil && s.cfg.Fallback != nil {
		state = s.cfg.Fallback
		s.log.Warn("Kafka holds no source state (its data was deleted, or kafka.topic_prefix changed); resuming the slot from the warehouse's copy",
			"slot", state.Slot, "snapshotted", state.Snapshotted)
		if err := store.SaveState(ctx, *state); err != nil {
			return err
		}
	}
	if restore {
		for _, t := range schemas {
			if err := sink.Schema(ctx, t); err != nil {
				return err
			}
		}
	}
	slotExists, err := s.slotExists(ctx, conn)
	if err != nil {
		return err
	}
	// A slot PostgreSQL invalidated (max_slot_wal_keep_size) is still
	// listed, but its WAL is gone: it is as lost as a dropped one.
	var lost bool
	if slotExists {
		if err := conn.QueryRow(ctx, `SELECT coalesce(wal_status = 'lost', false) FROM pg_replication_slots WHERE slot_name = $1`, s.cfg.Slot).Scan(&lost); err != nil {
			return fmt.Errorf("%w: read replication slot %s: %v", fault.ErrUnavailable, s.cfg.Slot, err)
		}
	}
	streaming := state != nil && state.Snapshotted && state.Slot == s.cfg.Slot
	present := slices.DeleteFunc(slices.Clone(s.cfg.Tables), func(t config.Table) bool { return slices.Contains(gone, t) })
	if err := ensurePublication(ctx, conn, s.cfg.Publication, present); err != nil {
		return err
	}
	switch {
	case streaming && (!slotExists || lost):
		s.planCopies(state, schemas, present)
		if err := s.replaceLostSlot(ctx, conn, store, state, present, lost); err != nil {
			return err
		}
	case state != nil && !state.Snapshotted && state.Slot == s.cfg.Slot && slotExists && !lost && state.ConsistentPoint != 0 && state.Copies != nil:
		// An initial snapshot that did not finish, under a slot that
		// still holds every change since its consistent point: the
		// stream goes on from there, and what the snapshot had not
		// copied is copied while it runs.
		state.Snapshotted = true
		s.planCopies(state, schemas, present)
		if err := store.SaveState(ctx, *state); err != nil {
			return err
		}
		s.log.Warn("an earlier initial snapshot did not finish: the stream goes on from its consistent point, and what it had not copied is copied while the stream runs",
			"slot", s.cfg.Slot, "consistent_point", state.ConsistentPoint, "tables_left", len(state.Copies))
	case streaming:
		if s.planCopies(state, schemas, present) {
			if err := store.SaveState(ctx, *state); err != nil {
				return err
			}
		}
	case slotExists && (state == nil || state.Slot != s.cfg.Slot):
		return fmt.Errorf("%w: replication slot %s exists but lakeflow did not create it for these topics; drop it (SELECT pg_drop_replication_slot('%s')) or choose another source.slot",
			fault.ErrSource, s.cfg.Slot, s.cfg.Slot)
	default:
		// An earlier snapshot that did not finish may have delivered part
		// of its rows, and under a new slot (the old one lost) the topics
		// hold what the old one captured: the new snapshot starts by
		// resetting every table, so rows deleted since leave silver too.
		redo := state != nil
		switch {
		case redo && state.Slot == s.cfg.Slot:
			s.log.Warn("an earlier initial snapshot did not finish; starting it again", "slot", s.cfg.Slot)
		case redo:
			s.log.Warn("a new replication slot: every table is taken again under it", "slot", s.cfg.Slot, "was", state.Slot)
			s.dropReplacedSlot(ctx, conn, state.Slot)
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
	for _, id := range state.Tables {
		if t := schemas[id]; t != nil {
			if err := sink.Track(ctx, t); err != nil {
				return err
			}
		}
	}
	s.stateMu.Lock()
	s.state = state
	s.stateMu.Unlock()
	return s.stream(ctx, sink, store, state, schemas, drain)
}

// replaceLostSlot creates the slot again, once lakeflow resync --all asks
// for it, and copies every table again while the new slot streams: the
// changes the lost slot held are gone from the WAL, so only a copy that
// reconciles (deleting the rows gone since) brings silver back to the
// source.
func (s *Source) replaceLostSlot(ctx context.Context, conn *pgx.Conn, store StateStore, state *change.SourceState, present []config.Table, invalidated bool) error {
	// A request for every table, buffered before the start, is taken
	// here; the others wait for the stream.
	var all []Resync
	for len(s.cfg.Resyncs) > 0 {
		r := <-s.cfg.Resyncs
		if r.Tables == nil {
			all = append(all, r)
		} else {
			s.held = append(s.held, r)
		}
	}
	if len(all) == 0 {
		return fmt.Errorf("%w: replication slot %s is gone (dropped, or invalidated by max_slot_wal_keep_size), so the changes after where lakeflow stands cannot be read from the WAL any more; run lakeflow resync --all: lakeflow then makes the slot again and copies every table while it streams, deleting in silver the rows gone since (lake and history go on)",
			fault.ErrSource, s.cfg.Slot)
	}
	if invalidated {
		if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s.cfg.Slot); err != nil {
			return fmt.Errorf("%w: drop the invalidated slot %s: %v; run SELECT pg_drop_replication_slot('%s') as a role that may, then lakeflow run", fault.ErrSource, s.cfg.Slot, err, s.cfg.Slot)
		}
	}
	repl, _, err := s.createSlot(ctx, "NOEXPORT_SNAPSHOT")
	if err != nil {
		return err
	}
	repl.Close(ctx)
	err = s.saveCopies(ctx, store, state, func() {
		// The WAL a parked table waited in is gone with the slot: its
		// copy judges its shape again.
		state.Parked = nil
		state.Copies = state.Copies[:0]
		for _, t := range present {
			state.Copies = append(state.Copies, change.TableCopy{Table: t.String(), Reconcile: true})
		}
		s.referencedFirst(state.Copies)
	})
	if err != nil {
		return err
	}
	s.log.Warn("the replication slot was lost: made again, every table is copied again while it streams", "slot", s.cfg.Slot, "tables", len(present))
	for _, r := range all {
		if r.Accepted != nil {
			r.Accepted()
		}
	}
	return nil
}

// planCopies brings the tables the state captures in line with
// source.tables (present: those that exist): a table added is copied
// while the stream runs (a table captured before, reconciled with what
// silver holds of it), and a table taken out is no longer captured. It
// reports whether the state changed.
func (s *Source) planCopies(state *change.SourceState, schemas map[string]*change.Table, present []config.Table) bool {
	changed := false
	for _, t := range present {
		id := t.String()
		if slices.Contains(state.Tables, id) {
			continue
		}
		state.Tables = append(state.Tables, id)
		state.Copies = append(state.Copies, change.TableCopy{Table: id, Reconcile: schemas[id] != nil})
		s.log.Info("a table added to source.tables is copied while the others stream", "table", id, "captured_before", schemas[id] != nil)
		changed = true
	}
	state.Tables = slices.DeleteFunc(state.Tables, func(id string) bool {
		if slices.ContainsFunc(s.cfg.Tables, func(t config.Table) bool { return t.String() == id }) {
			return false
		}
		s.log.Info("a table taken out of source.tables is no longer captured; its silver, history and lake stay", "table", id)
		state.Copies = slices.DeleteFunc(state.Copies, func(c change.TableCopy) bool { return c.Table == id })
		// Parked, it held the slot: its changes are not wanted any more.
		state.Parked = slices.DeleteFunc(state.Parked, func(p change.ParkedTable) bool { return p.Table == id })
		changed = true
		return true
	})
	s.referencedFirst(state.Copies)
	return changed
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

// publishSchema records t, the schema of rel from position at on, if it is
// new or evolves the recorded one without changing any value (columns
// added, types widened), and fails with fault.ErrSchemaBreak otherwise,
// before any change of the new shape is handed on. copied says every row
// of the table is copied as of at (a snapshot): a column added since
// needs no value for the rows that predate it.
func (s *Source) publishSchema(ctx context.Context, sink Sink, schemas map[string]*change.Table, t *change.Table, rel *relation, at change.Position, copied bool) error {
	prev := schemas[t.ID()]
	if prev != nil && at.Less(prev.Since) {
		// PostgreSQL re-sends WAL from before the recorded schema took
		// effect (the slot's position is saved only at checkpoints): its
		// Relation messages describe the layout of their time, which the
		// schema history already holds.
		return nil
	}
	t.Since = at
	if prev != nil {
		for i, c := range t.Columns {
			if j := prev.Column(c.Name); j >= 0 {
				t.Columns[i].Fill = prev.Columns[j].Fill
			}
		}
	}
	if prev != nil && prev.Equal(t) {
		return nil
	}
	// A table a resync is about to copy again gets every row's values
	// from the copy.
	copied = copied || s.copying(t.ID())
	if prev != nil {
		stop := func(err error) error {
			next := "edit the contract: lakeflow run --follow takes the edit within seconds, any other lakeflow run at its start"
			switch {
			case rel.past != nil:
				// Dropped since: no contract edit brings it back.
				next = fmt.Sprintf("the table no longer exists in the source: take %s out of source.tables once its changes before this one are in (silver, history and lake keep it), or edit the contract", t.ID())
			case errors.Is(err, ErrUnknownValues):
				// No contract can say what PostgreSQL wrote into the
				// rows: they must be read again.
				next = fmt.Sprintf("run lakeflow resync %s: lakeflow copies its rows again, their new values with them", t.ID())
			}
			return &schemaStop{table: t, at: at, reason: err, fix: next}
		}
		d, accepted, err := contracts.Judge(s.cfg.Contracts.For(t.Schema, t.Name), prev, t)
		var refusal *contracts.Refusal
		if copied && errors.As(err, &refusal) && !slices.ContainsFunc(refusal.Changes, func(c change.BreakingChange) bool { return c.What != "moved" }) {
			// Columns that changed places cannot be told apart by the
			// stream; a copy reads every row again.
			err = nil
		}
		if err != nil {
			return stop(err)
		}
		t.Accepted = accepted
		if len(d.Widened)+len(d.Narrowed) > 0 && !copied && rel.rewritten(prev) {
			s.log.Warn("PostgreSQL rewrote the table to change a column's type: if a USING expression changed values, silver holds the old ones until lakeflow resync",
				"table", t.ID(), "changes", describe(d), "run", "lakeflow resync "+t.ID())
		}
		if len(d.Renamed) > 0 {
			t.Renames = map[string]string{}
			for _, r := range d.Renamed {
				t.Renames[r.To] = r.From
				t.Columns[t.Column(r.To)].Fill = prev.Columns[prev.Column(r.From)].Fill
			}
		}
		var added []string
		for _, c := range d.Added {
			if !copied {
				fill, err := rel.fill(prev, c, at)
				if err != nil {
					return stop(err)
				}
				t.Columns[t.Column(c.Name)].Fill = fill
			}
			added = append(added, c.Name+" "+c.Type.Name)
		}
		s.log.Info("source table evolved", "table", t.ID(), "added", added, "changes", describe(d), "accepted_by_contract", accepted, "lsn", at)
	}
	if p := s.parkedEntry(t.ID()); p != nil && p.Released == 0 && !at.Less(p.At) {
		// Parked before this run, and accepted now: the contract was
		// edited, or a resync asked for, while it was stopped.
		if _, err := s.release(ctx, t.ID(), "a change made while lakeflow was stopped"); err != nil {
			return err
		}
	}
	backlog(s.state, t, at)
	if err := sink.Schema(ctx, t); err != nil {
		return err
	}
	schemas[t.ID()] = t
	return nil
}

// parkedEntry is the state's entry for a parked table id, or nil.
func (s *Source) parkedEntry(id string) *change.ParkedTable {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return parked(s.state, id)
}

// copying reports whether a copy of the table is scheduled or under way.
func (s *Source) copying(id string) bool {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.state != nil && slices.ContainsFunc(s.state.Copies, func(c change.TableCopy) bool { return c.Table == id })
}

func (s *Source) configured(schema, name string) bool {
	for _, t := range s.cfg.Tables {
		if t.Schema == schema && t.Name == name {
			return true
		}
	}
	return false
}

// describe lists a schema change's parts for the log.
func describe(d change.Diff) []string {
	var out []string
	for _, r := range append(append(d.Widened, d.Narrowed...), d.Retyped...) {
		out = append(out, r.Column.Name+" "+r.From.Name+" → "+r.Column.Type.Name)
	}
	for _, r := range d.Renamed {
		out = append(out, "renamed "+r.From+" → "+r.To)
	}
	for _, c := range d.Dropped {
		out = append(out, "dropped "+c.Name)
	}
	return out
}
