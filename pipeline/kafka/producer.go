package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// deliveryTimeout fails a record Kafka has not accepted in this time,
// which stops the source with a clear error instead of hanging.
const deliveryTimeout = 2 * time.Minute

// Producer writes the source's events to one topic per table and keeps
// the source's state in Kafka, next to the events. It implements
// postgres.Sink and postgres.StateStore.
//
// Only one goroutine (the source's) may call Schema, Event, EndTxn,
// SaveState and the Load methods; Durable and Flush are safe from any.
type Producer struct {
	cfg    Config
	cl     *kgo.Client
	adm    *kadm.Client
	env    change.Envelope
	log    *slog.Logger
	hasher kgo.TopicPartitioner
	probe  kgo.Record // reused to ask hasher for a key's partition

	topics  map[string]*topicState // by table ID
	touched []*partState           // partitions produced to since the last boundary
	slab    []byte

	mu      sync.Mutex // guards pending
	pending []boundary
	durable atomic.Uint64
	failed  atomic.Pointer[error]
}

type topicState struct {
	name  string
	parts []*partState
}

// partState tracks one topic partition. produced is counted by the source
// goroutine; acked by kgo's promises, which run in produce order per
// partition, so acked >= n means the first n records are in Kafka.
type partState struct {
	topic     string
	partition int32
	// high is the highest position in this partition; stream events at or
	// below it are already in Kafka (PostgreSQL re-sends after a restart).
	high     change.Position
	produced int64
	acked    atomic.Int64
	touched  bool
	promise  func(*kgo.Record, error)
}

// boundary is the end of a transaction: it is durable once every
// partition it touched has acknowledged up to the recorded count.
type boundary struct {
	end   change.LSN
	marks []mark
}

type mark struct {
	part     *partState
	produced int64
}

// NewProducer connects to the brokers.
func NewProducer(cfg Config, log *slog.Logger) (*Producer, error) {
	cl, err := newClient(cfg.Brokers,
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()),
		kgo.ProducerBatchMaxBytes(MaxMessageBytes),
		kgo.MaxBufferedRecords(20000),
		kgo.MaxBufferedBytes(64<<20),
		kgo.RecordDeliveryTimeout(deliveryTimeout),
		kgo.ProducerLinger(5*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	return &Producer{
		cfg: cfg, cl: cl, adm: kadm.NewClient(cl), log: log,
		env:    change.Envelope{Name: cfg.Prefix, Database: cfg.Database},
		hasher: kgo.StickyKeyPartitioner(nil).ForTopic(""),
		topics: map[string]*topicState{},
	}, nil
}

// Close releases the client; call Flush first.
func (p *Producer) Close() { p.cl.Close() }

func (p *Producer) err() error {
	if e := p.failed.Load(); e != nil {
		return *e
	}
	return nil
}

// Schema records t in the schema topic and waits for Kafka to have it.
func (p *Producer) Schema(ctx context.Context, t *change.Table) error {
	ts, err := p.topic(ctx, t)
	if err != nil {
		return err
	}
	val, err := json.Marshal(SchemaRecord{Topic: ts.name, Table: t})
	if err != nil {
		return err
	}
	return p.put(ctx, SchemaTopic(p.cfg.Prefix), t.ID(), val)
}

// SchemaRecord is the value of a schema topic record.
type SchemaRecord struct {
	Topic string        `json:"topic"`
	Table *change.Table `json:"schema"`
}

// Event encodes ev and produces it, unless its partition already holds it.
func (p *Producer) Event(ctx context.Context, ev *change.Event) error {
	if err := p.err(); err != nil {
		return err
	}
	ts, err := p.topic(ctx, ev.Table)
	if err != nil {
		return err
	}
	if cap(p.slab)-len(p.slab) < 64<<10 {
		p.slab = make([]byte, 0, 1<<20)
	}
	start := len(p.slab)
	if p.slab, err = p.env.AppendKey(p.slab, ev); err != nil {
		return fmt.Errorf("%w: encode %s at %s: %v", fault.ErrSchemaBreak, ev.Table.ID(), ev.Pos, err)
	}
	key := p.slab[start:len(p.slab):len(p.slab)]
	if ev.Op == change.OpTruncate {
		key = nil // a truncate concerns every key: it goes to every partition
	}
	var value []byte
	for i, part := range ts.parts {
		if key != nil && len(ts.parts) > 1 && i != p.partitionOf(key, len(ts.parts)) {
			continue
		}
		if ev.Pos.Ord > 0 && !part.high.Less(ev.Pos) {
			continue
		}
		if value == nil {
			start = len(p.slab)
			if p.slab, err = p.env.AppendValue(p.slab, ev, time.Now().UnixMilli()); err != nil {
				return fmt.Errorf("%w: encode %s at %s: %v", fault.ErrSchemaBreak, ev.Table.ID(), ev.Pos, err)
			}
			value = p.slab[start:len(p.slab):len(p.slab)]
		}
		part.high = ev.Pos
		part.produced++
		if !part.touched {
			part.touched = true
			p.touched = append(p.touched, part)
		}
		p.cl.Produce(context.Background(), &kgo.Record{Topic: part.topic, Partition: part.partition, Key: key, Value: value}, part.promise)
	}
	return nil
}

func (p *Producer) partitionOf(key []byte, n int) int {
	p.probe.Key = key
	return p.hasher.Partition(&p.probe, n)
}

// EndTxn closes a transaction boundary at end.
func (p *Producer) EndTxn(end change.LSN) {
	b := boundary{end: end, marks: make([]mark, len(p.touched))}
	for i, part := range p.touched {
		b.marks[i] = mark{part: part, produced: part.produced}
		part.touched = false
	}
	p.touched = p.touched[:0]
	p.mu.Lock()
	p.pending = append(p.pending, b)
	p.mu.Unlock()
}

// Durable returns the end LSN of the last transaction whose events, and
// all before them, Kafka has acknowledged.
func (p *Producer) Durable() change.LSN {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for ; n < len(p.pending); n++ {
		b := p.pending[n]
		ok := true
		for _, m := range b.marks {
			if m.part.acked.Load() < m.produced {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		p.durable.Store(uint64(b.end))
	}
	if n > 0 {
		p.pending = append(p.pending[:0], p.pending[n:]...)
	}
	return change.LSN(p.durable.Load())
}

// Flush waits until Kafka has acknowledged every record produced so far.
func (p *Producer) Flush(ctx context.Context) error {
	if err := p.cl.Flush(ctx); err != nil {
		return err
	}
	p.Durable()
	return p.err()
}

// topic returns the topic state of a table, creating the topic and
// reading each partition's last position on first use.
func (p *Producer) topic(ctx context.Context, t *change.Table) (*topicState, error) {
	if ts, ok := p.topics[t.ID()]; ok {
		return ts, nil
	}
	name := TableTopic(p.cfg.Prefix, t.Schema, t.Name)
	n, err := ensureTopic(ctx, p.cl, name, p.cfg.Partitions, tableTopicConfigs(p.cfg))
	if err != nil {
		return nil, err
	}
	if n != p.cfg.Partitions {
		p.log.Warn("topic keeps its own partition count", "topic", name, "partitions", n, "configured", p.cfg.Partitions)
	}
	ts := &topicState{name: name}
	_, end, err := offsets(ctx, p.adm, name)
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		part := &partState{topic: name, partition: int32(i)}
		part.promise = func(_ *kgo.Record, err error) {
			if err != nil {
				err = fmt.Errorf("%w: kafka: produce to %s/%d: %v", fault.ErrUnavailable, part.topic, part.partition, err)
				p.failed.CompareAndSwap(nil, &err)
				return
			}
			part.acked.Add(1)
		}
		if o, ok := end.Lookup(name, int32(i)); ok && o.Offset > 0 {
			if part.high, err = p.lastPosition(ctx, name, int32(i), o.Offset); err != nil {
				return nil, err
			}
		}
		ts.parts = append(ts.parts, part)
	}
	p.topics[t.ID()] = ts
	return ts, nil
}

// lastPosition reads the position of the record at end-1.
func (p *Producer) lastPosition(ctx context.Context, topic string, partition int32, end int64) (change.Position, error) {
	recs, err := readRange(ctx, p.cfg.Brokers, topic, partition, end-1, end)
	if err != nil || len(recs) == 0 {
		return change.Position{}, errors.Join(err, fmt.Errorf("%w: kafka: cannot read the last record of %s/%d", fault.ErrUnavailable, topic, partition))
	}
	var pos struct {
		Seq uint64 `json:"_cdc_seq"`
		Ord uint32 `json:"_cdc_ord"`
	}
	if err := json.Unmarshal(recs[0].Value, &pos); err != nil {
		return change.Position{}, fmt.Errorf("%w: %s/%d offset %d is not a lakeflow envelope (%v); is another producer writing to lakeflow's topics?",
			fault.ErrUnavailable, topic, partition, end-1, err)
	}
	return change.Position{Seq: change.LSN(pos.Seq), Ord: pos.Ord}, nil
}

// put writes one keyed record to a meta topic and waits for it.
func (p *Producer) put(ctx context.Context, topic, key string, value []byte) error {
	if _, err := ensureTopic(ctx, p.cl, topic, 1, metaTopicConfigs()); err != nil {
		return err
	}
	res := p.cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Key: []byte(key), Value: value})
	if err := res.FirstErr(); err != nil {
		return unavailable("write "+topic, err)
	}
	return nil
}
