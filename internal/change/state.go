package change

import (
	"fmt"
	"maps"
	"slices"
)

// SourceState is what the source must remember across runs. It is kept
// in Kafka next to the events, and the warehouse keeps a copy, so a
// pipeline whose Kafka data was lost still knows its slot.
type SourceState struct {
	Slot            string `json:"slot"`
	ConsistentPoint LSN    `json:"consistent_point"`
	// SnapshotTime (µs since the epoch) is the _commit_ts of snapshot rows.
	SnapshotTime int64 `json:"snapshot_time_us"`
	// Snapshotted is set once every snapshot row is acknowledged.
	Snapshotted bool     `json:"snapshotted"`
	Tables      []string `json:"tables"`
	// Key signs what lakeflow writes to its meta topics (hex; see
	// kafka.Signer). SignedFrom is, per meta topic, the offset from which
	// records are signed: a pipeline older than signing wrote those
	// before unsigned.
	Key        string           `json:"key,omitempty"`
	SignedFrom map[string]int64 `json:"signed_from,omitempty"`
	// Copies are the tables being copied while the stream runs (added
	// to source.tables after the initial snapshot, or resynced), in the
	// order they are copied.
	Copies []TableCopy `json:"copies,omitempty"`
	// Parked are the tables whose change of shape lakeflow cannot follow
	// by itself (a contract refuses it, or only a copy can say the values
	// it wrote): their changes wait in the WAL while the others go on.
	Parked []ParkedTable `json:"parked,omitempty"`
}

// Clone returns a copy of s that shares nothing with it (nil for nil):
// the source changes its state in place as it goes, so a goroutine that
// compares with it needs a copy of its own.
func (s *SourceState) Clone() *SourceState {
	if s == nil {
		return nil
	}
	c := *s
	c.Tables = slices.Clone(s.Tables)
	c.SignedFrom = maps.Clone(s.SignedFrom)
	c.Copies = slices.Clone(s.Copies)
	for i := range c.Copies {
		c.Copies[i].After = slices.Clone(c.Copies[i].After)
	}
	c.Parked = slices.Clone(s.Parked)
	return &c
}

// ParkedTable is a table whose changes from At on are not handed over:
// the slot is confirmed no further than the transaction before At, so
// the WAL keeps them until a contract edit or a resync releases the
// table and the stream reads them again.
type ParkedTable struct {
	Table string   `json:"table"`
	At    Position `json:"at"`
	// Reason is the refusal; Fix what releases the table.
	Reason string `json:"reason"`
	Fix    string `json:"fix"`
	// Released, once set, is the WAL's end when the table was released:
	// its changes from At up to there are handed over although
	// downstream is past them, and the slot stays held until downstream
	// has applied up to there.
	Released LSN `json:"released,omitempty"`
	// Since is when the table was parked (µs since the epoch).
	Since int64 `json:"since_us"`
}

// Stop says why the table is parked, where its changes wait, and what
// releases it.
func (p ParkedTable) Stop() string {
	return fmt.Sprintf("%s; the table's changes from %s on wait in the WAL, where the slot keeps them, so nothing is lost: %s", p.Reason, p.At, p.Fix)
}

// TableCopy is where the copy of one table stands: it goes in chunks of
// rows in key order, each saved once Kafka holds it, so a restart goes
// on from the last chunk saved.
type TableCopy struct {
	Table string `json:"table"`
	// After is the key of the last row copied, each key column's text;
	// nil before the first chunk.
	After []string `json:"after,omitempty"`
	// Since is the position the copy began at (set with its first
	// chunk): a row of silver last written before it that the copy did
	// not write again is gone from the source.
	Since LSN `json:"since,omitempty"`
	// Reconcile says silver may hold rows of the table from before the
	// copy (a resync, a table captured again): the copy ends with a
	// mark that deletes those it did not write.
	Reconcile bool  `json:"reconcile,omitempty"`
	Rows      int64 `json:"rows"`
}

// Boundary is the end of a source transaction (or of the snapshot, or a
// point where nothing was open): every event at or before Seq has been
// handed over, and End is the WAL position PostgreSQL may be told is done.
type Boundary struct {
	// Seq bounds the positions handed over: events with _cdc_seq <= Seq.
	Seq LSN
	// End is the transaction's end LSN (what a slot acknowledgement names).
	End LSN
	// Commit is the commit time (µs since the epoch), 0 when unknown.
	Commit int64
}

// Watermark says that every event with _cdc_seq <= Seq is in Kafka, below
// the given end offsets. Offsets lists only the partitions written since
// the previous watermark; the others have not moved. The bounds may hold
// events after Seq too (written before a restart): a batch ending at a
// watermark takes, in each partition, the events up to Seq.
//
// A split mark (Split) says less: every event with _cdc_seq < Seq is
// below the offsets, while the transaction at Seq, too large for one
// batch, is still being written: it may be applied in several batches,
// and nothing after it meanwhile.
type Watermark struct {
	Seq     LSN                        `json:"seq"`
	End     LSN                        `json:"end"`
	Commit  int64                      `json:"commit_us,omitempty"`
	Offsets map[string]map[int32]int64 `json:"offsets,omitempty"`
	Split   bool                       `json:"split,omitempty"`
}
