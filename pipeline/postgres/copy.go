package postgres

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// A table added to source.tables after the initial snapshot, or resynced,
// is copied while the stream runs, without a new slot and without a lock
// beyond what a SELECT takes: DBLog's algorithm (Debezium's incremental
// snapshot). The copier reads the table in key order, a chunk at a time,
// each read between a low and a high watermark it writes into the WAL.
// The stream notes the keys changed between the two; at the high
// watermark it hands over the chunk's rows but those, whose changes the
// stream carries (and newer than anything the chunk could hold), as
// snapshot rows positioned at the high watermark: after every change the
// chunk could have seen, before every change it could not.
const (
	copyPrefix = "lakeflow-copy"
	chunkRows  = 8192
	chunkBytes = 16 << 20
	// maxRedo bounds how often a chunk is read again for large values
	// left unchanged in its window, so a busy table's copy ends.
	maxRedo = 20
)

// chunkRead, if set (by tests), runs between a chunk's read and its high
// watermark: changes it makes fall in the chunk's window, and an error it
// returns is the read's.
var chunkRead func(table string) error

// chunk is one chunk of a copy, passed between the copier and the stream.
type chunk struct {
	id      string
	tableID string
	cfg     tableRef
	first   bool
	opened  chan struct{} // the stream saw the low watermark
	done    chan struct{} // the stream saw the high watermark
	// Set by the stream at the low watermark: the table's schema (the
	// columns the copier reads), the watermark's position, and why the
	// copy cannot go on (the table is gone, or parked).
	table  *change.Table
	since  change.LSN
	err    error
	parked bool
	// What the copy says of itself: reconcile (its last chunk ends with
	// a reconcile mark), and where it began (0: at this chunk).
	reconcile bool
	copySince change.LSN
	// Set by the copier before it writes the high watermark, and ready
	// closed.
	ready chan struct{}
	rows  [][]change.Datum
	taken int64 // µs since the epoch: the rows' _commit_ts
	last  bool
	// lastTry: the chunk was read again too often for changes that left
	// large values unchanged; it is handed over as it is.
	lastTry bool
	// Set by the stream at the high watermark: the boundary it closed,
	// or that the chunk must be read again (the table's schema or
	// contents changed under it); resolve: with the catalog's schema.
	end     change.LSN
	redo    bool
	resolve bool
}

type tableRef struct{ schema, name string }

// copies are the chunks in flight and, on the stream's side, the keys
// each table being copied changed since its chunk's low watermark.
type copies struct {
	mu      sync.Mutex
	chunks  map[string]*chunk
	windows map[string]*window // the stream's goroutine only
}

// window is what the stream saw of a table between a chunk's watermarks.
type window struct {
	// changed are the keys changed; unchanged those of them whose change
	// left a large value unchanged (REPLICA IDENTITY DEFAULT): if the
	// chunk holds one, it is read again, since only a row read after
	// that change has the value (the copy may not have delivered the row
	// before it).
	changed, unchanged map[string]bool
	// truncated: the chunk is read again.
	truncated bool
}

func (c *copies) add(ch *chunk) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chunks == nil {
		c.chunks = map[string]*chunk{}
	}
	c.chunks[ch.id] = ch
}

func (c *copies) take(id string) *chunk {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chunks[id]
}

func (c *copies) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.chunks, id)
}

// windowKey is the text of a row's key, as the stream and a chunk both
// have it (PostgreSQL's text output, which never holds a NUL byte).
func windowKey(t *change.Table, img []change.Datum) string {
	var b strings.Builder
	for _, i := range t.KeyColumns() {
		b.Write(img[i].Text)
		b.WriteByte(0)
	}
	return b.String()
}

// noteChange records, during a chunk's window, that ev changed its key.
func (s *Source) noteChange(ev *change.Event) {
	w := s.copies.windows[ev.Table.ID()]
	switch {
	case w == nil:
	case ev.Op == change.OpTruncate:
		w.truncated = true
	default:
		key := windowKey(ev.Table, ev.Image())
		w.changed[key] = true
		for _, d := range ev.After {
			if d.Unchanged() {
				w.unchanged[key] = true
				break
			}
		}
	}
}

// copyMark handles a copy's watermark coming through the stream.
// Watermarks of a copier that is gone (written before a restart) are
// ignored: its chunk is read again.
func (s *Source) copyMark(ctx context.Context, cat *catalog, sink Sink, schemas map[string]*change.Table, content string, lsn change.LSN, commit int64) error {
	kind, id, _ := strings.Cut(content, " ")
	ch := s.copies.take(id)
	if ch == nil {
		return nil
	}
	// As for every message outside a transaction: positions before the
	// message's end (see handle).
	pos := change.Position{Seq: lsn - 1}
	switch kind {
	case "L":
		defer close(ch.opened)
		if s.isParked(ch.tableID) {
			ch.parked = true
			return nil
		}
		t := schemas[ch.tableID]
		if ch.first || t == nil {
			rel, err := cat.relationByName(ctx, ch.cfg.schema, ch.cfg.name)
			if err == nil {
				t, err = cat.table(ctx, rel, rel.snapshotColumns(), schemas[ch.tableID])
			}
			if errors.Is(err, ErrGone) {
				ch.err = err
				return nil
			}
			if err != nil {
				return connLost{err}
			}
			err = s.publishSchema(ctx, sink, schemas, t, rel, pos, true)
			var stop *schemaStop
			if errors.As(err, &stop) {
				ch.parked = true
				return s.park(ctx, stop)
			}
			if err != nil {
				return err
			}
			t = schemas[ch.tableID]
		}
		ch.table, ch.since = t, pos.Seq
		if s.copies.windows == nil {
			s.copies.windows = map[string]*window{}
		}
		s.copies.windows[ch.tableID] = &window{changed: map[string]bool{}, unchanged: map[string]bool{}}
	case "H":
		defer close(ch.done)
		<-ch.ready // closed before the copier wrote the watermark
		w := s.copies.windows[ch.tableID]
		delete(s.copies.windows, ch.tableID)
		ch.end = lsn
		if ch.table == nil || w == nil || w.truncated || schemas[ch.tableID] != ch.table || s.isParked(ch.tableID) {
			ch.redo = true
			return nil
		}
		if len(w.unchanged) > 0 && !ch.lastTry && slices.ContainsFunc(ch.rows, func(row []change.Datum) bool { return w.unchanged[windowKey(ch.table, row)] }) {
			ch.redo = true
			return nil
		}
		ev := change.Event{Table: ch.table, Op: change.OpRead, LSN: lsn, Commit: ch.taken, Pos: pos, Snapshot: change.SnapshotIncremental}
		for _, row := range ch.rows {
			// (Most windows see no change of the table: no key is made.)
			if len(w.changed) > 0 && w.changed[windowKey(ch.table, row)] {
				continue
			}
			ev.After = row
			if err := sink.Event(ctx, &ev); err != nil {
				return err
			}
			s.Stats.Events.Add(1)
		}
		if ch.last && ch.reconcile {
			since := cmp.Or(ch.copySince, ch.since)
			mark := change.Event{Table: ch.table, Op: change.OpReconcile, LSN: since, Commit: ch.taken,
				Pos: change.Position{Seq: pos.Seq, Ord: 1}, Snapshot: change.SnapshotIncremental}
			if err := sink.Event(ctx, &mark); err != nil {
				return err
			}
		}
		sink.EndTxn(change.Boundary{Seq: pos.Seq, End: lsn, Commit: commit})
	}
	return nil
}

// runCopies copies the tables state.Copies lists, one after another,
// saving each chunk's progress once Kafka holds its rows. It returns
// when they are done, or with the error that stopped it. The stream's
// goroutine may add copies meanwhile (resync); stateMu orders both.
func (s *Source) runCopies(ctx context.Context, sink Sink, store StateStore, state *change.SourceState, stopped <-chan struct{}) error {
	conn, err := connect(ctx, s.cfg.DSN)
	if err != nil {
		return connLost{err}
	}
	defer conn.Close(context.Background())
	defer s.Stats.Copy.Store(nil)
	for {
		s.stateMu.Lock()
		next := s.nextCopy()
		if next < 0 {
			s.stateMu.Unlock()
			return nil
		}
		c := state.Copies[next]
		progress := &CopyProgress{Table: c.Table, Left: len(state.Copies) - 1}
		s.stateMu.Unlock()
		progress.Rows.Store(c.Rows)
		s.Stats.Copy.Store(progress)
		ref, ok := s.tableRef(c.Table)
		started := time.Now()
		redone := 0
		resolve := false
		for ok {
			ch, err := s.copyChunk(ctx, conn, sink, &c, ref, redone >= maxRedo, resolve, stopped)
			if err != nil {
				return err
			}
			if ch.parked {
				break
			}
			if ch.err != nil {
				s.log.Warn("a table being copied no longer exists in the source; its copy ends", "table", c.Table, "err", ch.err)
				break
			}
			resolve = ch.resolve
			if ch.redo {
				redone++
				s.log.Debug("chunk read again: the table changed under it", "table", c.Table, "times", redone)
				continue
			}
			if redone >= maxRedo {
				s.log.Warn("a chunk was read again too often: updates kept leaving large values unchanged in rows it holds; those keep the value silver had, which may be NULL until the next resync",
					"table", c.Table, "after", c.After, "run", "lakeflow resync "+c.Table)
			}
			redone = 0
			c.Since = cmp.Or(c.Since, ch.since)
			c.Rows += int64(len(ch.rows))
			progress.Rows.Store(c.Rows)
			if len(ch.rows) > 0 {
				c.After = keyText(ch.table, ch.rows[len(ch.rows)-1])
			}
			if ch.last {
				s.log.Info("table copied while the stream ran", "table", c.Table, "rows", c.Rows,
					"seconds", time.Since(started).Round(time.Millisecond).Seconds(), "reconciled", c.Reconcile)
				break
			}
			if err := s.saveCopies(ctx, store, state, func() { state.Copies[copyIndex(state.Copies, c.Table)] = c }); err != nil {
				return err
			}
			s.log.Debug("chunk copied", "table", c.Table, "rows", c.Rows)
		}
		if s.isParked(c.Table) {
			continue // its copy goes on once it is released
		}
		done := func() {
			i := copyIndex(state.Copies, c.Table)
			state.Copies = slices.Delete(state.Copies, i, i+1)
		}
		if err := s.saveCopies(ctx, store, state, done); err != nil {
			return err
		}
	}
}

// copyIndex is the place of the copy of table under way among copies: the
// first of that table (a resync meanwhile may have put others in front
// of it, and a second copy of it after it).
func copyIndex(copies []change.TableCopy, table string) int {
	return slices.IndexFunc(copies, func(c change.TableCopy) bool { return c.Table == table })
}

// saveCopies changes state's copies and saves the state.
func (s *Source) saveCopies(ctx context.Context, store StateStore, state *change.SourceState, edit func()) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	edit()
	return store.SaveState(ctx, *state)
}

// Resync asks for tables to be copied again while the stream runs, and
// reconciled: rows gone from the source are deleted. Accepted is called
// once the state that schedules the copies is saved.
type Resync struct {
	Tables   []string // qualified names; nil: every captured table
	Accepted func()
}

// resync schedules the copies a Resync asks for (a table already being
// copied is copied again after), and releases the tables among them that
// are parked: it reports whether one was parked in this session (the
// stream must read the WAL again for it).
func (s *Source) resync(ctx context.Context, store StateStore, state *change.SourceState, r Resync) (bool, error) {
	tables := r.Tables
	if tables == nil {
		tables = state.Tables
	}
	err := s.saveCopies(ctx, store, state, func() {
		for _, id := range tables {
			if _, ok := s.tableRef(id); ok {
				state.Copies = append(state.Copies, change.TableCopy{Table: id, Reconcile: true})
			}
		}
		s.referencedFirst(state.Copies)
	})
	if err != nil {
		return false, err
	}
	s.log.Info("resync requested: the tables are copied again while the others stream, and rows gone from the source deleted", "tables", tables)
	rewind := false
	for _, id := range tables {
		now, err := s.release(ctx, id, "lakeflow resync")
		if err != nil {
			return false, err
		}
		rewind = rewind || now
	}
	if r.Accepted != nil {
		r.Accepted()
	}
	return rewind, nil
}

// copiesLeft reports whether a copy waits that the copier can make: one
// of a table that is not parked.
func (s *Source) copiesLeft() bool {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.nextCopy() >= 0
}

// nextCopy is the place in the state's copies of the first whose table
// is not parked in this session, or -1; stateMu is held. A parked
// table's copy waits for its release, which starts a new session.
func (s *Source) nextCopy() int {
	return slices.IndexFunc(s.state.Copies, func(c change.TableCopy) bool { return s.parkedNow[c.Table] == nil })
}

// referencedFirst orders copies so that a table a contract's existence
// rule references is copied before the tables whose rows point to it:
// their copied rows find the rows they reference in silver instead of
// being held back by the rule. Copies already under way keep their place.
func (s *Source) referencedFirst(copies []change.TableCopy) {
	depth := map[string]int{}
	var visit func(id string, seen map[string]bool) int
	visit = func(id string, seen map[string]bool) int {
		if d, ok := depth[id]; ok {
			return d
		}
		if seen[id] {
			return 0 // a cycle of references: no order helps
		}
		seen[id] = true
		d := 0
		if c := s.cfg.Contracts[id]; c != nil {
			for _, r := range c.Rules {
				if r.References != nil && r.References.Table.String() != id {
					d = max(d, 1+visit(r.References.Table.String(), seen))
				}
			}
		}
		depth[id] = d
		return d
	}
	started := 0
	for started < len(copies) && copies[started].Since != 0 {
		started++
	}
	slices.SortStableFunc(copies[started:], func(a, b change.TableCopy) int {
		return visit(a.Table, map[string]bool{}) - visit(b.Table, map[string]bool{})
	})
}

// tableRef finds a configured table by its qualified name.
func (s *Source) tableRef(id string) (tableRef, bool) {
	for _, t := range s.cfg.Tables {
		if t.String() == id {
			return tableRef{t.Schema, t.Name}, true
		}
	}
	return tableRef{}, false
}

// copyChunk reads one chunk between its watermarks and waits until the
// stream has handed it over and Kafka holds it.
func (s *Source) copyChunk(ctx context.Context, conn *pgx.Conn, sink Sink, c *change.TableCopy, ref tableRef, lastTry, resolve bool, stopped <-chan struct{}) (*chunk, error) {
	b := make([]byte, 8)
	rand.Read(b)
	ch := &chunk{id: hex.EncodeToString(b), tableID: c.Table, cfg: ref, first: c.Since == 0 || resolve, reconcile: c.Reconcile, copySince: c.Since, lastTry: lastTry,
		opened: make(chan struct{}), ready: make(chan struct{}), done: make(chan struct{})}
	s.copies.add(ch)
	defer s.copies.remove(ch.id)
	wait := func(on <-chan struct{}) error {
		select {
		case <-on:
			return nil
		case <-stopped:
			return context.Canceled
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := emitOn(ctx, conn, copyPrefix, "L "+ch.id); err != nil {
		return nil, err
	}
	if err := awaitVisible(ctx, conn); err != nil {
		return nil, err
	}
	if err := wait(ch.opened); err != nil {
		return nil, err
	}
	switch {
	case ch.err != nil || ch.parked:
		return ch, nil
	case ch.table == nil:
		return nil, context.Canceled // the stream stopped at the watermark, with its own error
	}
	var err error
	ch.taken = time.Now().UnixMicro()
	ch.rows, ch.last, err = readChunk(ctx, conn, ch.table, c.After)
	if err == nil && chunkRead != nil {
		err = chunkRead(c.Table)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		switch {
		case transient(err):
			return nil, connLost{err}
		case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined table
			ch.err = fmt.Errorf("table %s %w", c.Table, ErrGone)
			return ch, nil
		case errors.As(err, &pgErr) && pgErr.Code == "42703": // undefined column
			// The table changed since the schema the stream holds: the
			// chunk is read again with the catalog's.
			ch.redo, ch.resolve = true, true
			return ch, nil
		}
		// Anything else (a privilege the role lacks, say) comes back at
		// every start: the way past it is named.
		return nil, fmt.Errorf("%w: copy %s: %v; every lakeflow run stops here until that is fixed, or the table is taken out of source.tables (the other tables then go on)",
			fault.ErrSource, c.Table, err)
	}
	close(ch.ready)
	if err := emitOn(ctx, conn, copyPrefix, "H "+ch.id); err != nil {
		return nil, err
	}
	if err := wait(ch.done); err != nil {
		return nil, err
	}
	for !ch.redo && sink.Durable() < ch.end {
		select {
		case <-stopped:
			return nil, context.Canceled
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return ch, nil
}

// awaitVisible waits until every transaction whose commit is already in
// the WAL is visible to a new snapshot. A commit is written to the WAL,
// then marked committed, and only then (after a synchronous standby's
// answer, if one is configured) seen by other sessions: one that came
// before the low watermark but is not seen yet would have its change
// before the window and the chunk's older row after it.
func awaitVisible(ctx context.Context, conn *pgx.Conn) error {
	for {
		var waiting bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) x WHERE pg_xact_status(x) = 'committed')`).Scan(&waiting)
		if err != nil {
			return connLost{fmt.Errorf("read the transactions in progress: %w", err)}
		}
		if !waiting {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// emitOn writes a logical message outside any transaction.
func emitOn(ctx context.Context, conn *pgx.Conn, prefix, content string) error {
	if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, $2)", prefix, content); err != nil {
		return connLost{fmt.Errorf("write %s message: %w", prefix, err)}
	}
	return nil
}

// readChunk reads the rows of t after key after (nil: from the first), in
// key order, up to chunkRows rows or chunkBytes bytes; last says the table
// has no more. Values are PostgreSQL's text output, as the stream's.
func readChunk(ctx context.Context, conn *pgx.Conn, t *change.Table, after []string) ([][]change.Datum, bool, error) {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	var keys, params []string
	for n, i := range t.KeyColumns() {
		keys = append(keys, cols[i])
		params = append(params, fmt.Sprintf("$%d", n+1))
	}
	where := ""
	var args [][]byte
	if after != nil {
		where = fmt.Sprintf(" WHERE (%s) > (%s)", strings.Join(keys, ", "), strings.Join(params, ", "))
		for _, k := range after {
			args = append(args, []byte(k))
		}
	}
	query := fmt.Sprintf("SELECT %s FROM %s%s ORDER BY %s LIMIT %d", strings.Join(cols, ", "),
		pgx.Identifier{t.Schema, t.Name}.Sanitize(), where, strings.Join(keys, ", "), chunkRows)
	rr := conn.PgConn().ExecParams(ctx, query, args, nil, nil, nil)
	var rows [][]change.Datum
	size := 0
	full := false
	for rr.NextRow() {
		if size >= chunkBytes {
			full = true
			continue // drained by Close; read again in the next chunk
		}
		vals := rr.Values()
		row := make([]change.Datum, len(vals))
		for i, v := range vals {
			if v == nil {
				row[i].Null = true
			} else {
				row[i].Text = append([]byte{}, v...)
				size += len(v)
			}
		}
		rows = append(rows, row)
	}
	if _, err := rr.Close(); err != nil {
		return nil, false, err
	}
	return rows, !full && len(rows) < chunkRows, nil
}

// keyText is the key of a row as text, one per key column.
func keyText(t *change.Table, row []change.Datum) []string {
	var key []string
	for _, i := range t.KeyColumns() {
		key = append(key, string(row[i].Text))
	}
	return key
}
