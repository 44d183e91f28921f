// Package change holds what crosses every stage boundary: the change Event,
// its Position in the WAL, the Table schema it belongs to, and the
// Debezium-style JSON envelope it travels in.
package change

import (
	"fmt"
)

// LSN is a PostgreSQL write-ahead log position.
type LSN uint64

// String formats the LSN the way PostgreSQL does: 0/1A2B3C4.
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// Position orders events exactly in commit order across all tables
// (DESIGN.md invariant 1). Seq is the LSN of the commit record of the
// event's transaction, Ord its ordinal inside the transaction (1, 2, …).
// Snapshot rows carry the slot's consistent point and Ord 0.
type Position struct {
	Seq LSN    `json:"seq"`
	Ord uint32 `json:"ord"`
}

// Less reports whether p comes before q.
func (p Position) Less(q Position) bool {
	return p.Seq < q.Seq || (p.Seq == q.Seq && p.Ord < q.Ord)
}

func (p Position) String() string { return fmt.Sprintf("%s#%d", p.Seq, p.Ord) }
