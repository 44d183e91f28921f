package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/stage"
)

// Logical messages lakeflow writes into the WAL for itself.
const (
	heartbeatPrefix = "lakeflow-heartbeat"
	drainPrefix     = "lakeflow-drain"
)

const (
	statusInterval = time.Second
	stopTimeout    = 30 * time.Second
)

// connLost marks errors of the connection or of a catalog lookup, after
// which the stream reconnects if the error is transient; anything else
// stops the source.
type connLost struct{ err error }

func (e connLost) Error() string { return e.err.Error() }
func (e connLost) Unwrap() error { return e.err }

// stream runs the replication stream, reconnecting with backoff and
// jitter when the connection drops (PostgreSQL restarts, network loss).
// Errors that recur on every attempt end it with a clear message.
func (s *Source) stream(ctx context.Context, sink Sink, store StateStore, state *change.SourceState, schemas map[string]*change.Table, drain <-chan struct{}) error {
	var b backoff
	var busySince time.Time
	for {
		began := time.Now()
		err := s.streamOnce(ctx, sink, store, state, schemas, drain)
		if errors.Is(err, errRewind) {
			if ctx.Err() != nil {
				return ctx.Err() // stopped while releasing: the next start reads the WAL again
			}
			continue
		}
		var lost connLost
		if err == nil || ctx.Err() != nil || !errors.As(err, &lost) {
			return err
		}
		if !transient(lost.err) {
			return fmt.Errorf("%w: %v (retrying would not help)", fault.ErrSource, lost.err)
		}
		if errors.Is(lost.err, errSlotBusy) {
			if busySince.IsZero() {
				busySince = began
			}
			if time.Since(busySince) > slotBusyTimeout {
				return fmt.Errorf("%w: replication slot %s is in use by another process (%v) and was not released for %s; stop that process, or give this pipeline its own source.slot",
					fault.ErrSource, s.cfg.Slot, lost.err, slotBusyTimeout)
			}
		} else {
			busySince = time.Time{}
		}
		if time.Since(began) > maxBackoff {
			b.reset() // it ran fine for a while: a new outage
		}
		wait := b.wait()
		s.log.Warn("source connection lost; reconnecting", "err", err, "backoff", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// streamOnce runs one replication connection. A reader goroutine copies
// messages off the socket into a channel bounded in bytes; this goroutine
// decodes them and hands events to the sink; a status goroutine confirms
// what is durable downstream to PostgreSQL every second and whenever
// asked.
func (s *Source) streamOnce(ctx context.Context, sink Sink, store StateStore, state *change.SourceState, schemas map[string]*change.Table, drain <-chan struct{}) error {
	conn, err := connect(ctx, s.cfg.DSN)
	if err != nil {
		return connLost{err}
	}
	defer conn.Close(context.Background())
	var confirmed pglogrepl.LSN
	err = conn.QueryRow(ctx, `SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, s.cfg.Slot).Scan(&confirmed)
	if err != nil {
		return connLost{fmt.Errorf("read slot %s: %w", s.cfg.Slot, err)}
	}
	repl, err := connectReplication(ctx, s.cfg.DSN)
	if err != nil {
		return connLost{err}
	}
	stopped := make(chan struct{})
	buf := newBudget(s.cfg.BufferBytes, &s.Stats)
	var wg sync.WaitGroup
	defer func() {
		close(stopped)
		buf.close()
		// Closing the socket is what ends a blocked ReceiveMessage; the
		// PgConn itself is closed once no goroutine uses it.
		repl.Conn().Close()
		wg.Wait()
		repl.Close(context.Background())
	}()
	// Start at 0/0: the server resumes at confirmed_flush_lsn. A start
	// beyond it would silently skip transactions.
	err = pglogrepl.StartReplication(ctx, repl, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", s.cfg.Publication), "messages 'true'"},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return connLost{fmt.Errorf("%w: %s", errSlotBusy, pgErr.Message)}
		}
		return connLost{fmt.Errorf("start replication on slot %s: %w", s.cfg.Slot, err)}
	}
	s.log.Info("streaming", "slot", s.cfg.Slot, "from", change.LSN(confirmed))
	s.once.Do(func() { close(s.streaming) })

	// Windows of chunks a copier before a reconnect opened never close;
	// a table parked before is judged again when its change comes.
	s.copies.windows = nil
	s.stateMu.Lock()
	clear(s.parkedNow)
	s.stateMu.Unlock()
	msgs := make(chan walMsg, 1<<16)
	readErr := make(chan error, 1)
	replyNow := make(chan struct{}, 1)
	wg.Add(2)
	go func() {
		defer wg.Done()
		stage.Enter(stage.WALRead)
		readErr <- s.read(repl, msgs, buf, replyNow, stopped)
		close(msgs)
	}()
	var statusMu sync.Mutex
	sendStatus := func() error {
		statusMu.Lock()
		defer statusMu.Unlock()
		lsn := max(pglogrepl.LSN(s.confirmable(sink)), confirmed)
		crash.Point(crash.SourceAcked)
		if err := sendStandbyStatus(repl, lsn); err != nil {
			return err
		}
		s.Stats.Confirmed.Store(uint64(lsn))
		return nil
	}
	go func() {
		defer wg.Done()
		// On failure the reader sees the broken connection too.
		every(statusInterval, replyNow, stopped, func() bool { return sendStatus() == nil })
	}()
	beats := s.heartbeat(ctx, stopped, &wg)
	// Tables to copy are copied beside the stream; a drain waits for
	// them, so a run that ends has copied them.
	var copying chan error
	startCopies := func() {
		copying = make(chan error, 1)
		wg.Add(1)
		go func(done chan<- error) {
			defer wg.Done()
			done <- s.runCopies(ctx, sink, store, state, stopped)
		}(copying)
	}
	// Resyncs asked for before the start come first: a run that drains
	// the WAL copies them.
	for len(s.cfg.Resyncs) > 0 {
		s.held = append(s.held, <-s.cfg.Resyncs)
	}
	for len(s.held) > 0 {
		if _, err := s.resync(ctx, store, state, s.held[0]); err != nil {
			return err
		}
		s.held = s.held[1:]
	}
	if s.copiesLeft() {
		startCopies()
	}
	drainAfterCopies := false
	settle := time.NewTicker(statusInterval)
	defer settle.Stop()

	drainCh := drain
	nonce := ""
	dec := NewDecoder()
	cat := newCatalog(conn)
	for {
		select {
		case <-ctx.Done():
			return s.stop(sink, sendStatus, ctx.Err())
		case <-drainCh:
			drainCh = nil
			if copying != nil {
				drainAfterCopies = true
				continue
			}
			if nonce, err = s.emitDrain(ctx); err != nil {
				return err
			}
		case r := <-s.cfg.Resyncs:
			rewind, err := s.resync(ctx, store, state, r)
			if err != nil {
				return err
			}
			if rewind {
				return errRewind
			}
			if copying == nil && s.copiesLeft() {
				startCopies()
			}
		case set := <-s.cfg.ContractEdits:
			rewind, err := s.contractsEdited(ctx, set, schemas)
			if err != nil {
				return err
			}
			if rewind {
				return errRewind
			}
		case <-settle.C:
			if err := s.settleParked(ctx, s.downstream(sink)); err != nil {
				return err
			}
		case err := <-copying:
			copying = nil
			if err != nil {
				if ctx.Err() != nil {
					return s.stop(sink, sendStatus, ctx.Err())
				}
				return err
			}
			if s.copiesLeft() { // a resync that came as the copier ended
				startCopies()
				continue
			}
			if drainAfterCopies {
				if nonce, err = s.emitDrain(ctx); err != nil {
					return err
				}
			}
		case err := <-beats:
			return connLost{err}
		case m, ok := <-msgs:
			if !ok {
				err := <-readErr
				if ctx.Err() != nil {
					return s.stop(sink, sendStatus, ctx.Err())
				}
				return connLost{err}
			}
			done, err := s.handle(ctx, dec, cat, sink, state, schemas, m, nonce)
			buf.release(len(m.data))
			if err != nil {
				return err
			}
			if done {
				return s.stop(sink, sendStatus, nil)
			}
		}
	}
}

// confirmable is the LSN the slot may be confirmed to: what the sink has
// made durable, no more than downstream has applied, and not past a
// parked table's first change.
func (s *Source) confirmable(sink Sink) change.LSN {
	return s.parkedLimit(s.downstream(sink))
}

// downstream is the LSN up to which the sink has made everything durable
// and downstream has applied it.
func (s *Source) downstream(sink Sink) change.LSN {
	lsn := sink.Durable()
	if s.cfg.Applied != nil {
		lsn = min(lsn, s.cfg.Applied())
	}
	return lsn
}

// handle processes one message; done reports that the drain marker arrived.
func (s *Source) handle(ctx context.Context, dec *Decoder, cat *catalog, sink Sink, state *change.SourceState, schemas map[string]*change.Table, m walMsg, nonce string) (bool, error) {
	s.Stats.Received.Store(uint64(m.lsn))
	stage.Enter(stage.Decode)
	res, err := dec.Decode(m.data, m.lsn)
	if err != nil {
		if errors.Is(err, ErrIdentity) {
			return false, fmt.Errorf("%w: %v", fault.ErrSchemaBreak, err)
		}
		return false, fmt.Errorf("decode WAL at %s: %w", m.lsn, err)
	}
	switch res.Kind {
	case ResultRows:
		for i := range res.Events {
			ev := &res.Events[i]
			if s.ignored[ev.Table] || (ev.Pos.Seq <= s.cfg.Delivered && !backlogged(state, ev)) {
				continue
			}
			if len(s.copies.windows) > 0 {
				s.noteChange(ev)
			}
			if err := sink.Event(ctx, ev); err != nil {
				return false, err
			}
		}
		s.Stats.Events.Add(int64(len(res.Events)))
	case ResultCommit:
		sink.EndTxn(change.Boundary{Seq: res.Seq, End: res.End, Commit: res.Commit})
	case ResultRelation:
		return false, s.relation(ctx, dec, cat, sink, state, schemas, res.Relation, dec.NextPosition(m.lsn))
	case ResultMessage:
		msg := res.Message
		if msg.Transactional || dec.InTransaction() {
			return false, nil
		}
		// Nothing is open: everything before this message is handed over,
		// so its LSN may be confirmed once the sink has acknowledged that.
		// The source as of it is the source as of the last commit.
		// pgoutput gives the message's end, where the next record starts:
		// a transaction whose commit record comes right after it has that
		// LSN as its position, so the boundary's position is one byte
		// before (a commit starts on an aligned LSN, never there); at the
		// LSN itself the warehouse, which drops changes at or before its
		// last boundary as applied, would drop that transaction.
		b := change.Boundary{Seq: change.LSN(msg.LSN) - 1, End: change.LSN(msg.LSN), Commit: dec.LastCommit()}
		if msg.Prefix == heartbeatPrefix || msg.Prefix == drainPrefix {
			sink.EndTxn(b)
		}
		if msg.Prefix == drainPrefix {
			return nonce != "" && string(msg.Content) == nonce, nil
		}
		if msg.Prefix == copyPrefix {
			return false, s.copyMark(ctx, cat, sink, schemas, string(msg.Content), change.LSN(msg.LSN), dec.LastCommit())
		}
	}
	return false, nil
}

// relation resolves a Relation message and checks it against the schema
// recorded for the table: additive changes are recorded, anything else
// stops ingestion before the first change that would need it. A Relation
// message can be years old (the slot was behind): a table it names may
// have been dropped since, or taken out of source.tables, and a type it
// uses dropped; what the WAL and the schema history say decodes it.
func (s *Source) relation(ctx context.Context, dec *Decoder, cat *catalog, sink Sink, state *change.SourceState, schemas map[string]*change.Table, rel *pglogrepl.RelationMessage, at change.Position) error {
	id := change.QualifiedName(rel.Namespace, rel.RelationName)
	if prev := dec.Table(rel.RelationID); prev != nil && prev.ID() != id {
		return fmt.Errorf("%w: table %s was renamed to %s; ingestion stopped at %s", fault.ErrSchemaBreak, prev.ID(), id, at)
	}
	cols := make([]rawColumn, len(rel.Columns))
	for i, c := range rel.Columns {
		cols[i] = rawColumn{Name: c.Name, OID: c.DataType, TypMod: c.TypeModifier}
	}
	if s.isParked(id) {
		// Whatever shape it has now: its changes wait for the release.
		s.skip(dec, rel)
		return nil
	}
	configured := s.configured(rel.Namespace, rel.RelationName)
	if !configured && (schemas[id] != nil || slices.Contains(state.Tables, id)) {
		s.ignore(dec, rel, id, "taken out of source.tables")
		return nil
	}
	recorded := schemas[id]
	r, err := cat.relation(ctx, rel.RelationID, rel.Namespace, rel.RelationName)
	if errors.Is(err, ErrGone) {
		if !configured || recorded == nil {
			// A partition dropped since, or a table lakeflow never
			// captured: nothing of it reaches silver.
			s.ignore(dec, rel, id, "dropped from the source and never captured")
			return nil
		}
		r, err = pastRelation(rel.RelationID, recorded), nil
	}
	var t *change.Table
	if err == nil {
		t, err = cat.table(ctx, r, cols, recorded)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		switch {
		case ctx.Err() != nil:
			return ctx.Err() // stopped during the lookup, not a schema break
		case errors.As(err, &pgErr) || transient(err):
			return connLost{err}
		}
		return fmt.Errorf("%w: %v", fault.ErrSchemaBreak, err)
	}
	dec.SetTable(rel.RelationID, t)
	if !configured {
		// Publishing via the partition root, pgoutput also describes the
		// partition a change was made in; the change itself names the root.
		if root, err := cat.partitionRoot(ctx, rel.RelationID); err != nil {
			return connLost{err}
		} else if root != nil && s.configured(root.Schema, root.Name) {
			s.ignored[t] = true
			return nil
		}
		return fmt.Errorf("%w: table %s is in publication %s but not in source.tables (renamed?); ingestion stopped at %s",
			fault.ErrSchemaBreak, id, s.cfg.Publication, at)
	}
	err = s.publishSchema(ctx, sink, schemas, t, r, at, false)
	var stop *schemaStop
	if errors.As(err, &stop) {
		s.ignored[t] = true
		return s.park(ctx, stop)
	}
	return err
}

// ignore skips a relation's changes (skip), and says so once per table.
func (s *Source) ignore(dec *Decoder, rel *pglogrepl.RelationMessage, id, why string) {
	s.skip(dec, rel)
	if !s.skipped[id] {
		s.skipped[id] = true
		s.log.Info("changes of a table that is not captured are skipped", "table", id, "because", why)
	}
}

// skip registers a relation whose changes are skipped, described by its
// Relation message alone (the decoder needs its columns to read them).
func (s *Source) skip(dec *Decoder, rel *pglogrepl.RelationMessage) {
	t := &change.Table{Schema: rel.Namespace, Name: rel.RelationName}
	for _, c := range rel.Columns {
		t.Columns = append(t.Columns, change.Column{Name: c.Name, Type: change.Type{Kind: change.KindOther}})
	}
	dec.SetTable(rel.RelationID, t)
	s.ignored[t] = true
}
