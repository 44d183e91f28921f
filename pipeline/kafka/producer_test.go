package kafka

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/change"
)

// TestDurableStopsAtAFailedRecord: a record Kafka refused, followed by
// records it accepted, must never let the slot be confirmed past the
// refused one's transaction.
func TestDurableStopsAtAFailedRecord(t *testing.T) {
	p := &Producer{moved: map[*partState]int64{}}
	part := &partState{topic: "t", last: 10}
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

// TestWatermarkOffsetsComeFromKafka: records another producer wrote between
// lakeflow's (garbage, on a table topic) do not shift where a
// transaction's records end.
func TestWatermarkOffsetsComeFromKafka(t *testing.T) {
	p := &Producer{moved: map[*partState]int64{}}
	part := &partState{topic: "t"}
	part.produced, part.touched = 2, true
	p.touched = append(p.touched, part)
	p.ack(part, &kgo.Record{Offset: 0}, nil)
	p.EndTxn(change.Boundary{Seq: 99, End: 100})
	p.ack(part, &kgo.Record{Offset: 5}, nil) // offsets 1-4: another producer's records
	if got := p.Durable(); got != 100 {
		t.Fatalf("durable %s, want 0/64", got)
	}
	if m := p.moved[part]; m != 6 {
		t.Fatalf("the transaction ends at offset %d, want 6", m)
	}
}
