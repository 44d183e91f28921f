package postgres

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lakeflow/lakeflow/internal/change"
)

// sendStandbyStatus confirms lsn to the server (written, flushed and
// applied). It writes the message straight to the socket, not through
// pgconn's send buffer: the reader goroutine's pgconn writes to that
// buffer when the connection fails (its Terminate message), and the two
// must not share it. A net.Conn takes concurrent writes whole.
func sendStandbyStatus(repl *pgconn.PgConn, lsn pglogrepl.LSN) error {
	data := make([]byte, 0, 34)
	data = append(data, pglogrepl.StandbyStatusUpdateByteID)
	for range 3 {
		data = binary.BigEndian.AppendUint64(data, uint64(lsn))
	}
	data = binary.BigEndian.AppendUint64(data, uint64(time.Since(pgEpoch).Microseconds()))
	data = append(data, 0) // no reply requested
	msg, err := (&pgproto3.CopyData{Data: data}).Encode(nil)
	if err != nil {
		return err
	}
	_, err = repl.Conn().Write(msg)
	return err
}

// pgEpoch is where PostgreSQL's timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

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
