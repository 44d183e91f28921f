package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// Logical messages lakeflow writes into the WAL for itself.
const (
	heartbeatPrefix = "lakeflow-heartbeat"
	drainPrefix     = "lakeflow-drain"
)

const (
	statusInterval = time.Second
	stopTimeout    = 30 * time.Second
	maxBackoff     = 30 * time.Second
)

// connLost marks errors of the replication connection itself, after which
// the stream reconnects; anything else stops the source.
type connLost struct{ err error }

func (e connLost) Error() string { return e.err.Error() }
func (e connLost) Unwrap() error { return e.err }

// stream runs the replication stream, reconnecting with backoff when the
// connection drops (PostgreSQL restarts, network loss).
func (s *Source) stream(ctx context.Context, sink Sink, state *State, schemas map[string]*change.Table, drain <-chan struct{}) error {
	const firstBackoff = 500 * time.Millisecond
	backoff := firstBackoff
	for {
		began := time.Now()
		err := s.streamOnce(ctx, sink, state, schemas, drain)
		var lost connLost
		if err == nil || ctx.Err() != nil || !errors.As(err, &lost) {
			return err
		}
		if time.Since(began) > maxBackoff {
			backoff = firstBackoff // it ran fine for a while: a new outage
		}
		s.log.Warn("source connection lost; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

type walMsg struct {
	lsn  change.LSN
	data []byte
}

// streamOnce runs one replication connection. A reader goroutine copies
// messages off the socket into a bounded channel; this goroutine decodes
// them and hands events to the sink; a status goroutine confirms the
// sink's durable LSN to PostgreSQL every second and whenever asked.
func (s *Source) streamOnce(ctx context.Context, sink Sink, state *State, schemas map[string]*change.Table, drain <-chan struct{}) error {
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
	var wg sync.WaitGroup
	defer func() {
		close(stopped)
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
		// 55006: the slot is still held by the session that just dropped.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code != "55006" {
			return fmt.Errorf("%w: start replication on slot %s: %v", fault.ErrSource, s.cfg.Slot, err)
		}
		return connLost{err}
	}
	s.log.Info("streaming", "slot", s.cfg.Slot, "from", change.LSN(confirmed))
	s.once.Do(func() { close(s.streaming) })

	msgs := make(chan walMsg, 8192)
	readErr := make(chan error, 1)
	replyNow := make(chan struct{}, 1)
	wg.Add(2)
	go func() {
		defer wg.Done()
		readErr <- s.read(repl, msgs, replyNow, stopped)
		close(msgs)
	}()
	var statusMu sync.Mutex
	sendStatus := func() error {
		statusMu.Lock()
		defer statusMu.Unlock()
		lsn := max(pglogrepl.LSN(sink.Durable()), confirmed)
		return pglogrepl.SendStandbyStatusUpdate(context.Background(), repl, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn,
		})
	}
	go func() {
		defer wg.Done()
		// On failure the reader sees the broken connection too.
		every(statusInterval, replyNow, stopped, func() bool { return sendStatus() == nil })
	}()
	beats := s.heartbeat(ctx, stopped, &wg)

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
			if nonce, err = s.emitDrain(ctx); err != nil {
				return err
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
			if err != nil {
				return err
			}
			if done {
				return s.stop(sink, sendStatus, nil)
			}
		}
	}
}

// stop waits (bounded) for the sink to acknowledge everything and confirms
// it to PostgreSQL.
func (s *Source) stop(sink Sink, sendStatus func() error, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := sink.Flush(ctx); err != nil {
		return errors.Join(cause, err)
	}
	if err := sendStatus(); err != nil && cause == nil {
		return connLost{err}
	}
	return cause
}

// handle processes one message; done reports that the drain marker arrived.
func (s *Source) handle(ctx context.Context, dec *Decoder, cat *catalog, sink Sink, state *State, schemas map[string]*change.Table, m walMsg, nonce string) (bool, error) {
	s.Stats.Received.Store(uint64(m.lsn))
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
			if s.ignored[ev.Table] {
				continue
			}
			if err := sink.Event(ctx, ev); err != nil {
				return false, err
			}
		}
		s.Stats.Events.Add(int64(len(res.Events)))
	case ResultCommit:
		sink.EndTxn(res.End)
	case ResultRelation:
		return false, s.relation(ctx, dec, cat, sink, state, schemas, res.Relation, m.lsn)
	case ResultMessage:
		msg := res.Message
		if msg.Transactional || dec.InTransaction() {
			return false, nil
		}
		// Nothing is open: everything before this message is handed over,
		// so its LSN may be confirmed once the sink has acknowledged that.
		switch msg.Prefix {
		case heartbeatPrefix:
			sink.EndTxn(change.LSN(msg.LSN))
		case drainPrefix:
			sink.EndTxn(change.LSN(msg.LSN))
			return nonce != "" && string(msg.Content) == nonce, nil
		}
	}
	return false, nil
}

// relation resolves a Relation message and checks it against the schema
// recorded for the table: additive changes are recorded, anything else
// stops ingestion before the first change that would need it.
func (s *Source) relation(ctx context.Context, dec *Decoder, cat *catalog, sink Sink, state *State, schemas map[string]*change.Table, rel *pglogrepl.RelationMessage, at change.LSN) error {
	id := rel.Namespace + "." + rel.RelationName
	if prev := dec.Table(rel.RelationID); prev != nil && prev.ID() != id {
		return fmt.Errorf("%w: table %s was renamed to %s; ingestion stopped at %s", fault.ErrSchemaBreak, prev.ID(), id, at)
	}
	cols := make([]rawColumn, len(rel.Columns))
	for i, c := range rel.Columns {
		cols[i] = rawColumn{Name: c.Name, OID: c.DataType, TypMod: c.TypeModifier}
	}
	t, err := cat.table(ctx, rel.Namespace, rel.RelationName, cols)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || errors.Is(err, net.ErrClosed) {
			return connLost{err}
		}
		return fmt.Errorf("%w: %v", fault.ErrSchemaBreak, err)
	}
	dec.SetTable(rel.RelationID, t)
	if !s.configured(id) {
		for _, old := range state.Tables {
			if old == id {
				s.ignored[t] = true // dropped from source.tables on purpose
				return nil
			}
		}
		return fmt.Errorf("%w: table %s is in publication %s but not in source.tables (renamed?); ingestion stopped at %s",
			fault.ErrSchemaBreak, id, s.cfg.Publication, at)
	}
	return s.publishSchema(ctx, sink, schemas, t, at)
}

// read copies replication messages off the connection. Receive buffers
// are reused by pgconn, so each message is copied into a chunk that stays
// valid until the garbage collector frees it.
func (s *Source) read(repl *pgconn.PgConn, msgs chan<- walMsg, replyNow chan<- struct{}, stopped <-chan struct{}) error {
	var chunk []byte
	for {
		msg, err := repl.ReceiveMessage(context.Background())
		if err != nil {
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return err
				}
				s.Stats.ServerWAL.Store(uint64(ka.ServerWALEnd))
				if ka.ReplyRequested {
					select {
					case replyNow <- struct{}{}:
					default:
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return err
				}
				s.Stats.ServerWAL.Store(uint64(xld.ServerWALEnd))
				n := len(xld.WALData)
				if n > cap(chunk)-len(chunk) {
					chunk = make([]byte, 0, max(n, 256<<10))
				}
				chunk = append(chunk, xld.WALData...)
				data := chunk[len(chunk)-n : len(chunk) : len(chunk)]
				select {
				case msgs <- walMsg{lsn: change.LSN(xld.WALStart), data: data}:
				case <-stopped:
					return nil
				}
			}
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.CopyDone:
			return errors.New("server ended the replication stream")
		}
	}
}

// every runs fn each interval and whenever wake fires, until stopped
// closes or fn returns false.
func every(interval time.Duration, wake <-chan struct{}, stopped <-chan struct{}, fn func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stopped:
			return
		case <-t.C:
		case <-wake:
		}
		if !fn() {
			return
		}
	}
}

// heartbeat writes a logical message every Heartbeat so the slot keeps
// advancing while the captured tables are idle. It reports a failure once.
func (s *Source) heartbeat(ctx context.Context, stopped <-chan struct{}, wg *sync.WaitGroup) <-chan error {
	errs := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		every(s.cfg.Heartbeat, nil, stopped, func() bool {
			_, err := s.emit(ctx, heartbeatPrefix, "")
			if err != nil && ctx.Err() == nil {
				errs <- err
				return false
			}
			return true
		})
	}()
	return errs
}

// emitDrain writes the drain marker; when it comes back through the
// stream, everything committed before it has been handed over.
func (s *Source) emitDrain(ctx context.Context) (string, error) {
	b := make([]byte, 8)
	rand.Read(b)
	nonce := hex.EncodeToString(b)
	lsn, err := s.emit(ctx, drainPrefix, nonce)
	if err != nil {
		return "", connLost{err}
	}
	s.log.Debug("draining the WAL", "until", lsn)
	return nonce, nil
}

func (s *Source) emit(ctx context.Context, prefix, content string) (change.LSN, error) {
	conn, err := connect(ctx, s.cfg.DSN)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var lsn pglogrepl.LSN
	err = conn.QueryRow(ctx, "SELECT pg_logical_emit_message(false, $1, $2)", prefix, content).Scan(&lsn)
	if err != nil {
		return 0, fmt.Errorf("write %s message: %w", prefix, err)
	}
	return change.LSN(lsn), nil
}
