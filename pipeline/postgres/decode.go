package postgres

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/change"
)

// ResultKind says what a decoded pgoutput message was.
type ResultKind int

// What Decode can return.
const (
	ResultOther    ResultKind = iota // nothing for the pipeline (origin, type)
	ResultBegin                      // a transaction started
	ResultCommit                     // Result.End is the transaction's end LSN
	ResultRelation                   // Result.Relation must be resolved and passed to SetTable
	ResultRows                       // Result.Events holds row events
	ResultMessage                    // Result.Message is a logical decoding message
)

// Result is what one message meant. Events and the datums inside them
// reference the message bytes and Decoder buffers: they are valid until
// the next Decode, and the message bytes must not be reused before then.
type Result struct {
	Kind     ResultKind
	Events   []change.Event
	Relation *pglogrepl.RelationMessage
	// Seq, End and Commit describe a committed transaction: its commit
	// LSN (the events' _cdc_seq), end LSN and commit time (µs).
	Seq, End change.LSN
	Commit   int64
	Message  *pglogrepl.LogicalDecodingMessage
}

// ErrIdentity reports a change that does not say which row it changes
// (REPLICA IDENTITY NOTHING).
var ErrIdentity = errors.New("replica identity names no row")

// Decoder turns pgoutput (protocol version 1) messages into change events
// carrying (_cdc_seq, _cdc_ord) positions. It is pure: no I/O, no clock,
// no logging. The caller resolves each Relation message into a
// change.Table and registers it with SetTable.
type Decoder struct {
	tables map[uint32]*change.Table
	inTxn  bool
	seq    change.LSN
	commit int64
	xid    uint32
	ord    uint32
	events []change.Event
}

// NewDecoder returns a Decoder with no relations.
func NewDecoder() *Decoder {
	return &Decoder{tables: map[uint32]*change.Table{}}
}

// SetTable registers the schema of a relation ID.
func (d *Decoder) SetTable(relationID uint32, t *change.Table) { d.tables[relationID] = t }

// Table returns the schema registered for a relation ID.
func (d *Decoder) Table(relationID uint32) *change.Table { return d.tables[relationID] }

// NextPosition is the position the next event will have: inside a
// transaction its commit LSN and the next ordinal, else lsn.
func (d *Decoder) NextPosition(lsn change.LSN) change.Position {
	if d.inTxn {
		return change.Position{Seq: d.seq, Ord: d.ord + 1}
	}
	return change.Position{Seq: lsn}
}

// InTransaction reports whether a Begin has been seen without its Commit.
func (d *Decoder) InTransaction() bool { return d.inTxn }

// LastCommit is the commit time (µs) of the last transaction decoded, 0
// before the first.
func (d *Decoder) LastCommit() int64 { return d.commit }

// pgEpochMicros is 2000-01-01 in microseconds since the Unix epoch.
const pgEpochMicros = 946684800 * 1000000

// Decode decodes the pgoutput message in data, which arrived at lsn.
func (d *Decoder) Decode(data []byte, lsn change.LSN) (Result, error) {
	if len(data) == 0 {
		return Result{}, errors.New("empty pgoutput message")
	}
	switch data[0] {
	case 'I', 'U', 'D':
		return d.decodeRow(data, lsn)
	case 'T':
		return d.decodeTruncate(data, lsn)
	case 'B':
		if len(data) < 21 {
			return Result{}, errors.New("short Begin message")
		}
		d.inTxn = true
		d.seq = change.LSN(binary.BigEndian.Uint64(data[1:]))
		d.commit = int64(binary.BigEndian.Uint64(data[9:])) + pgEpochMicros
		d.xid = binary.BigEndian.Uint32(data[17:])
		d.ord = 0
		return Result{Kind: ResultBegin}, nil
	}
	msg, err := parse(data)
	if err != nil {
		return Result{}, fmt.Errorf("parse pgoutput %q message: %w", data[0], err)
	}
	switch m := msg.(type) {
	case *pglogrepl.CommitMessage:
		if !d.inTxn || change.LSN(m.CommitLSN) != d.seq {
			return Result{}, fmt.Errorf("commit at %s does not match the open transaction (%s)", change.LSN(m.CommitLSN), d.seq)
		}
		d.inTxn = false
		return Result{Kind: ResultCommit, Seq: d.seq, End: change.LSN(m.TransactionEndLSN), Commit: d.commit}, nil
	case *pglogrepl.RelationMessage:
		return Result{Kind: ResultRelation, Relation: m}, nil
	case *pglogrepl.LogicalDecodingMessage:
		return Result{Kind: ResultMessage, Message: m}, nil
	}
	return Result{Kind: ResultOther}, nil
}

// parse wraps pglogrepl.Parse, whose decoders index into the message
// without bounds checks: a malformed message must be an error, not a crash.
func parse(data []byte) (msg pglogrepl.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			msg, err = nil, fmt.Errorf("malformed message: %v", r)
		}
	}()
	return pglogrepl.Parse(data)
}

func (d *Decoder) table(rel uint32) (*change.Table, error) {
	t, ok := d.tables[rel]
	if !ok {
		return nil, fmt.Errorf("change for relation %d arrived before its Relation message", rel)
	}
	if !d.inTxn {
		return nil, fmt.Errorf("change for %s outside a transaction", t.ID())
	}
	return t, nil
}

func (d *Decoder) event(t *change.Table, op change.Op, lsn change.LSN) change.Event {
	d.ord++
	return change.Event{
		Table: t, Op: op, LSN: lsn, TxID: d.xid, Commit: d.commit,
		Pos: change.Position{Seq: d.seq, Ord: d.ord}, Snapshot: change.SnapshotNone,
	}
}

// decodeTruncate decodes a Truncate: one event per truncated relation.
// (pglogrepl allocates the relation list from the count in the message
// before checking it against the message length.)
func (d *Decoder) decodeTruncate(data []byte, lsn change.LSN) (Result, error) {
	if len(data) < 6 {
		return Result{}, errors.New("short Truncate message")
	}
	n := int(binary.BigEndian.Uint32(data[1:]))
	rels := data[6:]
	if len(rels) != 4*n {
		return Result{}, fmt.Errorf("truncate message names %d relations in %d bytes", n, len(rels))
	}
	d.events = d.events[:0]
	for i := 0; i < n; i++ {
		t, err := d.table(binary.BigEndian.Uint32(rels[4*i:]))
		if err != nil {
			return Result{}, err
		}
		d.events = append(d.events, d.event(t, change.OpTruncate, lsn))
	}
	return Result{Kind: ResultRows, Events: d.events}, nil
}

// decodeRow decodes Insert, Update and Delete without copying values: the
// datums point into data. (pglogrepl.Parse copies every column byte by byte
// into its own allocation; rows are the hot path.)
func (d *Decoder) decodeRow(data []byte, lsn change.LSN) (Result, error) {
	if len(data) < 6 {
		return Result{}, fmt.Errorf("short %q message", data[0])
	}
	t, err := d.table(binary.BigEndian.Uint32(data[1:]))
	if err != nil {
		return Result{}, err
	}
	var before, after []change.Datum
	rest := data[5:]
	var oldKind byte
	if data[0] != 'I' && len(rest) > 0 && (rest[0] == 'K' || rest[0] == 'O') {
		oldKind = rest[0]
		if before, rest, err = decodeTuple(t, rest[1:]); err != nil {
			return Result{}, err
		}
	}
	if data[0] != 'D' {
		if len(rest) == 0 || rest[0] != 'N' {
			return Result{}, fmt.Errorf("%s: %q message without a new tuple", t.ID(), data[0])
		}
		if after, rest, err = decodeTuple(t, rest[1:]); err != nil {
			return Result{}, err
		}
	}
	if len(rest) != 0 {
		return Result{}, fmt.Errorf("%s: %d trailing bytes in %q message", t.ID(), len(rest), data[0])
	}
	// With REPLICA IDENTITY FULL ('O') the old row is complete. Without
	// it (a partition attached later, an identity changed mid-stream) an
	// update may come without the old row and a delete or key change with
	// the key alone ('K'; its other columns read as NULL, as Debezium
	// shows them): the new row is still complete, and a delete needs only
	// the key.
	// The new tuple marks unchanged out-of-line (TOASTed) values 'u': a
	// full old row has them; otherwise they stay unchanged, and the
	// warehouse takes them from the version before (silver's).
	if data[0] == 'D' && before == nil {
		return Result{}, fmt.Errorf("%w: %s sent a delete without the row's key (REPLICA IDENTITY NOTHING); run ALTER TABLE %s REPLICA IDENTITY DEFAULT",
			ErrIdentity, t.ID(), pgx.Identifier{t.Schema, t.Name}.Sanitize())
	}
	if oldKind == 'O' {
		for i := range after {
			if after[i].Unchanged() && !before[i].Unchanged() {
				after[i] = before[i]
			}
		}
	}
	d.events = d.events[:0]
	switch {
	case data[0] == 'I':
		ev := d.event(t, change.OpCreate, lsn)
		ev.After = after
		d.events = append(d.events, ev)
	case data[0] == 'D':
		ev := d.event(t, change.OpDelete, lsn)
		ev.Before, ev.KeyOnly = before, oldKind == 'K'
		d.events = append(d.events, ev)
	case before != nil && keyChanged(t, before, after):
		// Debezium's form of a primary-key update: a delete of the old key
		// and a create of the new one, in that order.
		del := d.event(t, change.OpDelete, lsn)
		del.Before, del.KeyOnly = before, oldKind == 'K'
		ins := d.event(t, change.OpCreate, lsn)
		ins.After = after
		d.events = append(d.events, del, ins)
	default:
		ev := d.event(t, change.OpUpdate, lsn)
		ev.Before, ev.After = before, after
		d.events = append(d.events, ev)
	}
	return Result{Kind: ResultRows, Events: d.events}, nil
}

// decodeTuple reads a TupleData. An unchanged-TOAST column is returned
// with Null false and Text nil.
func decodeTuple(t *change.Table, src []byte) ([]change.Datum, []byte, error) {
	if len(src) < 2 {
		return nil, nil, fmt.Errorf("%s: short tuple", t.ID())
	}
	n := int(binary.BigEndian.Uint16(src))
	if n != len(t.Columns) {
		return nil, nil, fmt.Errorf("%s: tuple has %d columns, relation has %d", t.ID(), n, len(t.Columns))
	}
	src = src[2:]
	row := make([]change.Datum, n)
	for i := range row {
		if len(src) == 0 {
			return nil, nil, fmt.Errorf("%s: truncated tuple", t.ID())
		}
		kind := src[0]
		src = src[1:]
		switch kind {
		case 'n':
			row[i].Null = true
		case 'u':
		case 't':
			if len(src) < 4 {
				return nil, nil, fmt.Errorf("%s: truncated tuple", t.ID())
			}
			l := int(binary.BigEndian.Uint32(src))
			if len(src) < 4+l {
				return nil, nil, fmt.Errorf("%s: truncated tuple", t.ID())
			}
			row[i].Text = src[4 : 4+l : 4+l]
			src = src[4+l:]
		default:
			return nil, nil, fmt.Errorf("%s: column %s has tuple kind %q; lakeflow reads text format", t.ID(), t.Columns[i].Name, kind)
		}
	}
	return row, src, nil
}

func keyChanged(t *change.Table, before, after []change.Datum) bool {
	for _, i := range t.KeyColumns() {
		if before[i].Null != after[i].Null || string(before[i].Text) != string(after[i].Text) {
			return true
		}
	}
	return false
}
