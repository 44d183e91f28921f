package postgres

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lakeflow/lakeflow/internal/change"
)

type walMsg struct {
	lsn  change.LSN
	data []byte
}

// read copies replication messages off the connection. Receive buffers
// are reused by pgconn, so each message is copied into a chunk that stays
// valid until the garbage collector frees it. It stops reading while buf
// is full, so PostgreSQL, not lakeflow's memory, holds a backlog.
func (s *Source) read(repl *pgconn.PgConn, msgs chan<- walMsg, buf *budget, replyNow chan<- struct{}, stopped <-chan struct{}) error {
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
				if !buf.acquire(n) {
					return nil
				}
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

// budget bounds the bytes of messages read and not yet handled.
type budget struct {
	mu     sync.Mutex
	cond   *sync.Cond
	used   int64
	limit  int64
	closed bool
	stats  *Stats
}

func newBudget(limit int64, stats *Stats) *budget {
	b := &budget{limit: limit, stats: stats}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// acquire waits until n bytes fit (a message larger than the whole
// budget is let through alone); false means the budget was closed.
func (b *budget) acquire(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.closed && b.used > 0 && b.used+int64(n) > b.limit {
		b.cond.Wait()
	}
	if b.closed {
		return false
	}
	b.used += int64(n)
	b.stats.Buffered.Store(b.used)
	if b.used > b.stats.BufferedPeak.Load() {
		b.stats.BufferedPeak.Store(b.used)
	}
	return true
}

func (b *budget) release(n int) {
	b.mu.Lock()
	b.used -= int64(n)
	b.stats.Buffered.Store(b.used)
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *budget) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
}
