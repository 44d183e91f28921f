package kafka

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/stage"
)

// deliveryTimeout fails a record Kafka has not accepted in this time,
// which stops the source with a clear error instead of hanging.
const deliveryTimeout = 2 * time.Minute

// watermarkInterval is how often the producer publishes a watermark when
// more transactions became durable.
const watermarkInterval = 50 * time.Millisecond

// ProducerBufferBytes bounds the records the producer holds until Kafka
// acknowledges them.
const ProducerBufferBytes = 64 << 20

// Producer writes the source's events to one topic per table, publishes
// watermarks (the transaction boundaries Kafka has acknowledged, with the
// end offset of every partition written) and keeps the source's state in
// Kafka, next to the events. It implements postgres.Sink and
// postgres.StateStore.
//
// Only one goroutine (the source's) may call Schema, Event, EndTxn and
// the Load methods; SaveState (the source's copier saves from its own),
// Durable and Flush are safe from any.
type Producer struct {
	cfg    Config
	cl     *kgo.Client
	adm    *kadm.Client
	env    change.Envelope
	log    *slog.Logger
	hasher kgo.TopicPartitioner
	probe  kgo.Record // reused to ask hasher for a key's partition

	topics       map[string]*topicState // by table ID
	touched      []*partState           // partitions produced to since the last boundary
	slab         []byte
	wmTopicReady bool

	mu      sync.Mutex // guards pending, last and moved
	pending []boundary
	last    change.Boundary // the newest durable boundary
	// moved are partitions whose end offset the next watermark must
	// carry.
	moved   map[*partState]int64
	durable atomic.Uint64
	failed  atomic.Pointer[error]
	// open is the position of the transaction being handed over (0:
	// none), and opened when its first event was (Unix ns): one that
	// takes long gets a split mark (publishWatermark); split is the last
	// that got one.
	open   atomic.Uint64
	opened atomic.Int64
	split  change.LSN

	wmMu      sync.Mutex // serializes watermark publishing
	published change.LSN // Seq of the last watermark produced (guarded by mu)
	stop      chan struct{}
	stopped   chan struct{}
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
	// broken is set on the first failed record: nothing after it counts
	// as acknowledged, so the slot can never be confirmed past a record
	// Kafka does not hold.
	broken  atomic.Bool
	touched bool
	promise func(*kgo.Record, error)

	mu sync.Mutex // guards ends and last
	// ends are the record counts that end a transaction in this
	// partition, waiting for the offset after their last record.
	ends []*txnEnd
	last int64 // the offset after the last acknowledged record
}

// txnEnd is where a transaction's records end in a partition: after its
// n-th record, at offset (once acknowledged). Offsets come from Kafka, not
// from counting: records another producer wrote in between (garbage the
// consumer sets aside as dead letters) cannot shift them.
type txnEnd struct {
	n      int64
	offset int64
}

// boundary is the end of a transaction: it is durable once every
// partition it touched has acknowledged its records.
type boundary struct {
	change.Boundary
	marks []mark
}

type mark struct {
	part *partState
	end  *txnEnd
}

// NewProducer connects to the brokers and starts publishing watermarks.
func NewProducer(cfg Config, log *slog.Logger) (*Producer, error) {
	var cl *kgo.Client
	var err error
	// The client's goroutines (batching, compression, requests) work for
	// the produce stage.
	stage.Within(stage.Produce, func() {
		cl, err = newClient(cfg.Brokers, producerOpts(kgo.ZstdCompression())...)
	})
	if err != nil {
		return nil, err
	}
	p := &Producer{
		cfg: cfg, cl: cl, adm: kadm.NewClient(cl), log: log,
		env:    change.Envelope{Name: cfg.Prefix, Database: cfg.Database},
		hasher: kgo.StickyKeyPartitioner(nil).ForTopic(""),
		topics: map[string]*topicState{},
		moved:  map[*partState]int64{},
		stop:   make(chan struct{}), stopped: make(chan struct{}),
	}
	go p.watermarks()
	return p, nil
}

// producerOpts are the producer's client options, with the batch
// compression codec. zstd: BenchmarkCodec (the demo's order envelopes,
// producer to broker to consumer, measured at a 5 ms linger) put its CPU
// per event below lz4's in five of seven rounds and within 10% in the
// other two (means 5.0 and 6.2 µs, snappy 5.4; uncompressed, the broker
// writes 651 bytes an event and costs more), and the broker keeps 65
// bytes an event against lz4's 113 and snappy's 121, so retention_bytes
// holds 1.7 times as many.
func producerOpts(codec kgo.CompressionCodec) []kgo.Opt {
	return []kgo.Opt{
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(codec),
		kgo.ProducerBatchMaxBytes(MaxMessageBytes),
		kgo.MaxBufferedRecords(20000),
		kgo.MaxBufferedBytes(ProducerBufferBytes),
		kgo.RecordDeliveryTimeout(deliveryTimeout),
		kgo.ProducerLinger(producerLinger),
	}
}

// producerLinger is how long a partition's records wait for more before
// they are sent. The embedded broker fsyncs each partition's batch of
// every produce request, in the loop that also answers fetches: with
// transactions committed synchronously, each decoded and sent as it
// commits, 5 ms made about 200 small requests a second, the broker's
// fsyncs took 1.6 s of CPU in a 30 s steady run and the consumer's
// fetches and the watermarks that end batches queued behind them. At
// 25 ms, alternated under that load: freshness p50 1.2-1.6 s against
// 2.3-4.1 s on a grown warehouse, 0.79 and 0.83 s against 1.19 and 1.03 s
// in quick benches; no change beyond the noise for a backlog or
// asynchronous commits, which arrive in bursts.
const producerLinger = 25 * time.Millisecond

// Close stops the watermarks and releases the client; call Flush first.
func (p *Producer) Close() {
	close(p.stop)
	<-p.stopped
	p.cl.Close()
}

func (p *Producer) err() error {
	if e := p.failed.Load(); e != nil {
		return *e
	}
	return nil
}

func (p *Producer) fail(err error) { p.failed.CompareAndSwap(nil, &err) }

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
	stage.Enter(stage.Encode)
	if err := p.err(); err != nil {
		return err
	}
	// The newest position handed over: a snapshot's truncates come a
	// position before its rows, table after table, and a split mark
	// must not name one a batch has gone past.
	if open := p.open.Load(); open == 0 {
		p.opened.Store(time.Now().UnixNano())
		p.open.Store(uint64(ev.Pos.Seq))
	} else if uint64(ev.Pos.Seq) > open {
		p.open.Store(uint64(ev.Pos.Seq))
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
	if ev.Op == change.OpTruncate || ev.Op == change.OpReconcile {
		key = nil // a truncate concerns every key: it goes to every partition
	}
	var value []byte
	for i, part := range ts.parts {
		if key != nil && len(ts.parts) > 1 && i != p.partitionOf(key, len(ts.parts)) {
			continue
		}
		if ev.Op == change.OpReconcile && i > 0 {
			break // its rows are all before it: the warehouse needs it once
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
		stage.Enter(stage.Produce) // and the client's goroutines it starts
		p.cl.Produce(context.Background(), &kgo.Record{Topic: part.topic, Partition: part.partition, Key: key, Value: value}, part.promise)
	}
	return nil
}

func (p *Producer) partitionOf(key []byte, n int) int {
	p.probe.Key = key
	return p.hasher.Partition(&p.probe, n)
}

// Track registers t's topic: the next watermark bounds what its
// partitions hold now (topic).
func (p *Producer) Track(ctx context.Context, t *change.Table) error {
	_, err := p.topic(ctx, t)
	return err
}

// EndTxn closes a transaction boundary.
func (p *Producer) EndTxn(b change.Boundary) {
	p.open.Store(0)
	p.opened.Store(0)
	nb := boundary{Boundary: b, marks: make([]mark, len(p.touched))}
	for i, part := range p.touched {
		nb.marks[i] = mark{part: part, end: part.expectEnd()}
		part.touched = false
	}
	p.touched = p.touched[:0]
	p.mu.Lock()
	p.pending = append(p.pending, nb)
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
			if m.part.acked.Load() < m.end.n {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		for _, m := range b.marks {
			m.part.mu.Lock()
			p.moved[m.part] = m.end.offset
			m.part.mu.Unlock()
		}
		p.last = b.Boundary
		p.durable.Store(uint64(b.End))
	}
	if n > 0 {
		p.pending = append(p.pending[:0], p.pending[n:]...)
	}
	return change.LSN(p.durable.Load())
}

// Flush waits until Kafka has acknowledged every record produced so far
// and a watermark names the last transaction.
func (p *Producer) Flush(ctx context.Context) error {
	if err := p.cl.Flush(ctx); err != nil {
		return err
	}
	if err := p.err(); err != nil {
		return err
	}
	if err := p.publishWatermark(); err != nil {
		return err
	}
	if err := p.cl.Flush(ctx); err != nil {
		return err
	}
	return p.err()
}

// watermarks publishes a watermark whenever more became durable.
func (p *Producer) watermarks() {
	stage.Enter(stage.Produce)
	defer close(p.stopped)
	t := time.NewTicker(watermarkInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if err := p.publishWatermark(); err != nil {
				p.fail(err)
			}
		}
	}
}

// publishWatermark produces a watermark for the newest durable boundary
// if it is new, or, while a large transaction is being handed over and
// everything before it is durable, a split mark for it (Watermark.Split):
// the consumer may then apply the transaction in parts, never anything
// after it. A partition opened after a restart may hold events of
// transactions the stream has not reached again, beyond the position of
// the watermark whose bounds take it in: the consumer cuts batches by
// position, not by bound alone.
func (p *Producer) publishWatermark() error {
	p.wmMu.Lock()
	defer p.wmMu.Unlock()
	p.Durable()
	p.mu.Lock()
	b := p.last
	var w change.Watermark
	open := change.LSN(p.open.Load())
	switch {
	case b.Seq != 0 && (b.Seq > p.published || len(p.moved) > 0):
		w = change.Watermark{Seq: b.Seq, End: b.End, Commit: b.Commit}
		p.published = b.Seq
	case open > b.Seq && open != p.split && time.Since(time.Unix(0, p.opened.Load())) >= splitAfter && len(p.pending) == 0:
		w = change.Watermark{Seq: open, Split: true}
		p.split = open
	default:
		p.mu.Unlock()
		return nil
	}
	w.Offsets = map[string]map[int32]int64{}
	for part, offset := range p.moved {
		if w.Offsets[part.topic] == nil {
			w.Offsets[part.topic] = map[int32]int64{}
		}
		w.Offsets[part.topic][part.partition] = offset
		delete(p.moved, part)
	}
	p.mu.Unlock()
	val, err := json.Marshal(w)
	if err != nil {
		return err
	}
	r := &kgo.Record{Topic: WatermarkTopic(p.cfg.Prefix), Partition: 0, Value: val}
	p.cfg.Signer.sign(r)
	p.cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
		if err != nil {
			p.fail(fmt.Errorf("%w: kafka: produce a watermark: %v", fault.ErrUnavailable, err))
			return
		}
		crash.Point(crash.Watermark)
	})
	return nil
}

// splitAfter is how long a transaction is handed over before it gets a
// split mark: a few watermark ticks, which a transaction of the usual
// size takes only under a burst (the consumer uses the mark only once it
// holds batch_bytes).
const splitAfter = 4 * watermarkInterval

// topic returns the topic state of a table, creating the topic and
// reading each partition's last position on first use.
func (p *Producer) topic(ctx context.Context, t *change.Table) (*topicState, error) {
	if ts, ok := p.topics[t.ID()]; ok {
		return ts, nil
	}
	name := TableTopic(p.cfg.Prefix, t.Schema, t.Name)
	if err := p.ensureWatermarkTopic(ctx); err != nil {
		return nil, err
	}
	n, err := ensureTopic(ctx, p.cl, name, p.cfg.Partitions, tableTopicConfigs())
	if err != nil {
		return nil, err
	}
	if n != p.cfg.Partitions {
		p.log.Warn("topic keeps its own partition count", "topic", name, "partitions", n, "configured", p.cfg.Partitions)
	}
	ts := &topicState{name: name}
	start, end, err := offsets(ctx, p.adm, name)
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		part := &partState{topic: name, partition: int32(i)}
		part.promise = func(r *kgo.Record, err error) { p.ack(part, r, err) }
		s, _ := start.Lookup(name, int32(i))
		e, _ := end.Lookup(name, int32(i))
		part.last = e.Offset
		if e.Offset > s.Offset {
			if part.high, err = p.lastPosition(ctx, name, int32(i), s.Offset, e.Offset); err != nil {
				return nil, err
			}
		}
		// What the partition holds now may not be in any watermark yet
		// (a restart: it may hold events of transactions the stream has
		// not reached again; a watermark's bounds are then wider than its
		// position, which the consumer cuts by position).
		p.mu.Lock()
		p.moved[part] = e.Offset
		p.mu.Unlock()
		ts.parts = append(ts.parts, part)
	}
	p.topics[t.ID()] = ts
	return ts, nil
}

// ack counts a record Kafka answered for. Promises run in produce order
// per partition, so acked counts the records that arrived, in order and
// without a gap; the first failure stops the count for good. The offset
// after a record that ends a transaction is kept for its watermark.
func (p *Producer) ack(part *partState, r *kgo.Record, err error) {
	if part.broken.Load() {
		return
	}
	if err != nil {
		part.broken.Store(true)
		p.fail(fmt.Errorf("%w: kafka: produce to %s/%d: %v", fault.ErrUnavailable, part.topic, part.partition, err))
		return
	}
	part.mu.Lock()
	n := part.acked.Add(1)
	part.last = r.Offset + 1
	for len(part.ends) > 0 && part.ends[0].n <= n {
		if part.ends[0].n == n {
			part.ends[0].offset = part.last
		}
		part.ends = part.ends[1:]
	}
	part.mu.Unlock()
}

// expectEnd registers that a transaction's records in the partition end
// with the one produced last. (Its acknowledgement may already be in: no
// record after it has been produced yet, so the last one acknowledged is
// it.)
func (part *partState) expectEnd() *txnEnd {
	e := &txnEnd{n: part.produced}
	part.mu.Lock()
	defer part.mu.Unlock()
	if part.acked.Load() == e.n {
		e.offset = part.last
	} else {
		part.ends = append(part.ends, e)
	}
	return e
}

func (p *Producer) ensureWatermarkTopic(ctx context.Context) error {
	if p.wmTopicReady {
		return nil
	}
	if _, err := ensureTopic(ctx, p.cl, WatermarkTopic(p.cfg.Prefix), 1, tableTopicConfigs()); err != nil {
		return err
	}
	p.wmTopicReady = true
	return nil
}

// lastPosition reads the position of the last envelope before end,
// looking further back when the last records are not envelopes (another
// producer's garbage, which the consumer sets aside as dead letters).
func (p *Producer) lastPosition(ctx context.Context, topic string, partition int32, start, end int64) (change.Position, error) {
	ctx, cancel := context.WithTimeout(ctx, deliveryTimeout)
	defer cancel()
	for span := int64(16); ; span *= 4 {
		from := max(end-span, start)
		recs, err := readRange(ctx, p.cfg.Brokers, topic, partition, from, end)
		if err != nil {
			return change.Position{}, fmt.Errorf("%w: kafka: read the last records of %s/%d: %v", fault.ErrUnavailable, topic, partition, err)
		}
		for i := len(recs) - 1; i >= 0; i-- {
			var pos struct {
				Seq *uint64 `json:"_cdc_seq"`
				Ord uint32  `json:"_cdc_ord"`
			}
			if json.Unmarshal(recs[i].Value, &pos) == nil && pos.Seq != nil {
				return change.Position{Seq: change.LSN(*pos.Seq), Ord: pos.Ord}, nil
			}
		}
		if from == start {
			return change.Position{}, nil // no envelope at all
		}
		end = from
	}
}

// put writes one keyed record to a meta topic and waits for it.
func (p *Producer) put(ctx context.Context, topic, key string, value []byte) error {
	if _, err := ensureTopic(ctx, p.cl, topic, 1, metaTopicConfigs()); err != nil {
		return err
	}
	r := &kgo.Record{Topic: topic, Partition: 0, Key: []byte(key), Value: value}
	p.cfg.Signer.sign(r)
	res := p.cl.ProduceSync(ctx, r)
	if err := res.FirstErr(); err != nil {
		return unavailable("write "+topic, err)
	}
	return nil
}
