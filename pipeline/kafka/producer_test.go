package kafka

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/pipeline/change"
)

// TestDurableStopsAtAFailedRecord: a record Kafka refused, followed by
// records it accepted, must never let the slot be confirmed past the
// refused one's transaction.
func TestDurableStopsAtAFailedRecord(t *testing.T) {
	p := &Producer{moved: map[*partState]movedTo{}}
	part := &partState{topic: "t", base: 10}
	produce := func(end change.LSN) {
		part.produced++
		part.touched = true
		p.touched = append(p.touched, part)
		p.EndTxn(change.Boundary{Seq: end - 1, End: end})
	}
	produce(100)
	produce(200)
	produce(300)
	p.ack(part, &kgo.Record{Offset: 10}, nil)
	p.ack(part, &kgo.Record{Offset: 11}, errors.New("refused"))
	p.ack(part, &kgo.Record{Offset: 12}, nil)
	if got := p.Durable(); got != 100 {
		t.Fatalf("durable %s after records 1 ok, 2 refused, 3 ok; want 0/64 (the first transaction only)", got)
	}
	if p.err() == nil {
		t.Fatal("the refusal was not reported")
	}
}

// TestDurableStopsAtAMisplacedRecord: a record that lands at another
// offset than expected means another producer writes to the partition:
// offsets in watermarks would be wrong.
func TestDurableStopsAtAMisplacedRecord(t *testing.T) {
	p := &Producer{moved: map[*partState]movedTo{}}
	part := &partState{topic: "t", base: 0}
	part.produced = 2
	part.touched = true
	p.touched = append(p.touched, part)
	p.EndTxn(change.Boundary{Seq: 99, End: 100})
	p.ack(part, &kgo.Record{Offset: 0}, nil)
	p.ack(part, &kgo.Record{Offset: 5}, nil)
	if got := p.Durable(); got != 0 {
		t.Fatalf("durable %s, want 0/0", got)
	}
}
