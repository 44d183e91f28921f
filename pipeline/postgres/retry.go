package postgres

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

const (
	firstBackoff = 500 * time.Millisecond
	maxBackoff   = 30 * time.Second
)

// slotBusyTimeout is how long a slot held by another session is waited
// for: after a reconnect, the walsender of the dropped connection may
// hold it for a moment; longer means another process uses it.
var slotBusyTimeout = 30 * time.Second

// errSlotBusy marks a replication slot held by another session (55006).
var errSlotBusy = errors.New("replication slot in use")

// transient reports whether err may heal by itself, so the stream
// reconnects: a lost or refused connection, a server starting up or
// shutting down, too many connections, a slot still held by the session
// that just dropped. Anything else (bad credentials, missing privileges,
// a catalog error) recurs on every attempt and ends the run.
func transient(err error) bool {
	if errors.Is(err, errSlotBusy) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "53"),          // insufficient resources
			strings.HasPrefix(pgErr.Code, "57P"),         // shutting down, cannot connect now
			pgErr.Code == "40001", pgErr.Code == "40P01", // serialization failure, deadlock
			pgErr.Code == "55006", pgErr.Code == "58030": // object in use, I/O error
			return true
		}
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "connection refused")
}

// backoff is an exponential delay with jitter, so many lakeflows that
// lost the same server do not reconnect in lockstep.
type backoff struct{ next time.Duration }

func (b *backoff) reset() { b.next = firstBackoff }

func (b *backoff) wait() time.Duration {
	if b.next == 0 {
		b.next = firstBackoff
	}
	d := b.next/2 + rand.N(b.next)
	b.next = min(b.next*2, maxBackoff)
	return d
}
