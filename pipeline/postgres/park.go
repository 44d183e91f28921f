package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// A change of a table's shape that lakeflow cannot follow by itself (a
// contract refuses it, or only a copy can say what values it wrote)
// parks that table instead of stopping the stream: its changes from the
// new shape on are not handed over, and the slot is confirmed no further
// than the transaction before them, so the WAL keeps them; every other
// table goes on. A contract edit or a resync releases the table: the
// stream reconnects and PostgreSQL sends the WAL from the slot again,
// the other tables' changes in it dropped as delivered, the parked
// table's handed over (change.Backlog tells the warehouse they are not
// stale).

// errRewind ends a stream session so that the next reads the WAL again
// from the slot: a parked table was released.
var errRewind = errors.New("a parked table was released: reading the WAL again from the slot")

// schemaStop is a change of a table's shape that lakeflow cannot follow
// by itself. The stream parks the table; a snapshot stops.
type schemaStop struct {
	table  *change.Table // the new shape
	at     change.Position
	reason error
	fix    string
}

func (e *schemaStop) Error() string {
	return change.ParkedTable{At: e.at, Reason: e.reason.Error(), Fix: e.fix}.Stop()
}
func (e *schemaStop) Unwrap() error { return fault.ErrSchemaBreak }

// parked returns the state's entry for table id, or nil.
func parked(state *change.SourceState, id string) *change.ParkedTable {
	if state == nil {
		return nil
	}
	for i := range state.Parked {
		if state.Parked[i].Table == id {
			return &state.Parked[i]
		}
	}
	return nil
}

// park records that stop's table waits: in the state, saved before
// anything after it is handed over, and for this session (its changes
// are skipped from here on, whatever shape they come in).
func (s *Source) park(ctx context.Context, stop *schemaStop) error {
	id := stop.table.ID()
	s.stateMu.Lock()
	p := parked(s.state, id)
	if p == nil || stop.at.Less(p.At) {
		s.state.Parked = slices.DeleteFunc(s.state.Parked, func(p change.ParkedTable) bool { return p.Table == id })
		s.state.Parked = append(s.state.Parked, change.ParkedTable{Table: id, At: stop.at, Since: time.Now().UnixMicro()})
		p = &s.state.Parked[len(s.state.Parked)-1]
	}
	p.Reason, p.Fix, p.Released = stop.reason.Error(), stop.fix, 0
	s.parkedNow[id] = stop.table
	err := s.store.SaveState(ctx, *s.state)
	s.stateMu.Unlock()
	if err != nil {
		return err
	}
	s.log.Error("table parked: its changes wait in the WAL while the other tables go on", "table", id, "at", stop.at, "reason", stop.reason, "fix", stop.fix)
	return nil
}

// isParked reports whether table id was parked in this session.
func (s *Source) isParked(id string) bool {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.parkedNow[id] != nil
}

// release lets table id go on: its changes from where it was parked are
// handed over once the stream reads them again. It reports whether the
// table was parked in this session (the stream must then read the WAL
// again to get them).
func (s *Source) release(ctx context.Context, id, why string) (bool, error) {
	s.stateMu.Lock()
	p := parked(s.state, id)
	s.stateMu.Unlock()
	if p == nil || p.Released != 0 {
		return false, nil
	}
	end, err := s.walEnd(ctx)
	if err != nil {
		return false, err
	}
	s.stateMu.Lock()
	if p = parked(s.state, id); p == nil {
		s.stateMu.Unlock()
		return false, nil
	}
	p.Released = end
	now := s.parkedNow[id] != nil
	delete(s.parkedNow, id)
	err = s.store.SaveState(ctx, *s.state)
	s.stateMu.Unlock()
	if err != nil {
		return false, err
	}
	s.log.Info("parked table released: its changes since it was parked are read from the WAL again", "table", id, "from", p.At, "by", why)
	return now, nil
}

// walEnd is where the source's WAL ends now: every change handed over
// so far is before it.
func (s *Source) walEnd(ctx context.Context) (change.LSN, error) {
	conn, err := connect(ctx, s.cfg.DSN)
	if err != nil {
		return 0, connLost{err}
	}
	defer conn.Close(context.Background())
	var end pglogrepl.LSN
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&end); err != nil {
		return 0, connLost{fmt.Errorf("read the WAL's end: %w", err)}
	}
	return change.LSN(end), nil
}

// contractsEdited takes edited contracts: tables parked in this session
// whose change they now accept are released. It reports whether the
// stream must read the WAL again for them.
func (s *Source) contractsEdited(ctx context.Context, set contracts.Set, schemas map[string]*change.Table) (bool, error) {
	s.stateMu.Lock()
	s.cfg.Contracts = set
	shapes := map[string]*change.Table{}
	for id, t := range s.parkedNow {
		shapes[id] = t
	}
	s.stateMu.Unlock()
	s.log.Info("contracts reloaded", "parked_tables", len(shapes))
	rewind := false
	for id, t := range shapes {
		if _, _, err := contracts.Judge(set.For(t.Schema, t.Name), schemas[id], t); err != nil {
			s.log.Warn("a parked table stays parked: its contract still refuses its change", "table", id, "err", err)
			continue
		}
		now, err := s.release(ctx, id, "the contract edit")
		if err != nil {
			return false, err
		}
		rewind = rewind || now
	}
	return rewind, nil
}

// backlogged says whether ev, at or before what downstream held when the
// run began, belongs to a released table's changes read again.
func backlogged(state *change.SourceState, ev *change.Event) bool {
	if len(state.Parked) == 0 {
		return false
	}
	p := parked(state, ev.Table.ID())
	return p != nil && p.Released != 0 && ev.Pos.Seq >= p.At.Seq
}

// backlog marks t, the schema a released table takes up again at at,
// with the span of its changes read again.
func backlog(state *change.SourceState, t *change.Table, at change.Position) {
	if p := parked(state, t.ID()); p != nil && p.Released != 0 && !at.Less(p.At) {
		t.Backlog = &change.Backlog{From: p.At.Seq, To: p.Released}
	}
}

// parkedLimit lowers lsn, a position the slot could be confirmed to, to
// before the first change of every parked table: the WAL keeps those.
func (s *Source) parkedLimit(lsn change.LSN) change.LSN {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if s.state != nil {
		for _, p := range s.state.Parked {
			lsn = min(lsn, p.At.Seq-1)
		}
	}
	return lsn
}

// settleParked forgets released tables whose changes downstream has
// applied (up to applied), so the slot moves past them again. Only a
// boundary past the WAL's end at the release says so: what was durable
// before the stream read the WAL again is at most there, and a boundary
// after it is acknowledged only after every event the stream handed over
// before it, the table's read again among them.
func (s *Source) settleParked(ctx context.Context, applied change.LSN) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if s.state == nil {
		return nil
	}
	n := len(s.state.Parked)
	s.state.Parked = slices.DeleteFunc(s.state.Parked, func(p change.ParkedTable) bool { return p.Released != 0 && applied > p.Released })
	if len(s.state.Parked) == n {
		return nil
	}
	return s.store.SaveState(ctx, *s.state)
}

// Parked lists the tables parked when the source stopped, and why.
func (s *Source) Parked() []change.ParkedTable {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if s.state == nil {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(s.state.Parked), func(p change.ParkedTable) bool { return p.Released != 0 })
}
