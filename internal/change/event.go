package change

// Op is the Debezium operation code of an event.
type Op byte

// The operations: create, update, delete, read (snapshot), truncate and
// the end of a reconciling copy.
const (
	OpCreate   Op = 'c'
	OpUpdate   Op = 'u'
	OpDelete   Op = 'd'
	OpRead     Op = 'r'
	OpTruncate Op = 't'
	// OpReconcile ends a copy that reconciles (TableCopy.Reconcile): every
	// row last written before the copy began (its LSN) that the copy did
	// not write again is gone from the source. Debezium's op for a
	// message, which its consumers pass over.
	OpReconcile Op = 'm'
)

// Datum is one column value in PostgreSQL's text output format. One
// that is neither NULL nor has text is unchanged: an update left the
// column's large (TOASTed) value as it was, and PostgreSQL did not log it
// (a table without REPLICA IDENTITY FULL); the warehouse takes it from
// the version before.
type Datum struct {
	Null bool
	Text []byte
}

// Unchanged reports whether d is an unchanged TOASTed value.
func (d Datum) Unchanged() bool { return !d.Null && d.Text == nil }

// Snapshot marks where a snapshot row sits, in Debezium's spelling.
type Snapshot string

// Snapshot marks; stream events carry SnapshotNone.
const (
	SnapshotNone Snapshot = "false"
	SnapshotRow  Snapshot = "true"
	// SnapshotIncremental marks rows a copy took while the stream ran
	// (Debezium's incremental snapshot).
	SnapshotIncremental Snapshot = "incremental"
)

// Event is one row change. Before and After are in Table.Columns order and
// nil when the image is absent (no before on insert, no after on delete).
// The decoder resolves unchanged-TOAST markers where the before image
// holds the value; an update's After may hold others (Datum.Unchanged).
type Event struct {
	Table    *Table
	Op       Op
	Pos      Position
	LSN      LSN // the change's own WAL position
	TxID     uint32
	Commit   int64 // commit time, microseconds since the Unix epoch
	Snapshot Snapshot
	Before   []Datum
	After    []Datum
	// KeyOnly marks a Before image that holds the key alone (the table
	// lacks REPLICA IDENTITY FULL): its other columns are unknown, not NULL.
	KeyOnly bool
}

// Image returns the row image that identifies the event's key: After for
// inserts, updates and snapshot rows, Before for deletes.
func (e *Event) Image() []Datum {
	if e.After != nil {
		return e.After
	}
	return e.Before
}
