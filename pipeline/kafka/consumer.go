package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/stage"
)

// Consumer reads table topics and the watermark topic at offsets the
// caller keeps (the warehouse stores them in the same transaction as the
// data), so no consumer group is involved. It never skips a record: a
// partition whose records were deleted before they were read is an error,
// never a silent jump to what is left.
type Consumer struct {
	cfg      Config
	cl       *kgo.Client
	adm      *kadm.Client
	assigned map[string]bool
	// next is, per topic and partition, the offset the next record must
	// have.
	next   map[string]map[int32]int64
	paused map[TopicPartition]bool
	// high is each partition's end as its last fetch reported it.
	high map[TopicPartition]int64
	// signer tells lakeflow's records on the meta topics from others'.
	signer *Signer
}

// TopicPartition names a partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Pause makes exactly the given partitions paused: they are not fetched
// until a later call leaves them out.
func (c *Consumer) Pause(want map[TopicPartition]bool) {
	pause, resume := map[string][]int32{}, map[string][]int32{}
	for tp := range want {
		if !c.paused[tp] {
			pause[tp.Topic] = append(pause[tp.Topic], tp.Partition)
		}
	}
	for tp := range c.paused {
		if !want[tp] {
			resume[tp.Topic] = append(resume[tp.Topic], tp.Partition)
		}
	}
	if len(pause) > 0 {
		c.cl.PauseFetchPartitions(pause)
	}
	if len(resume) > 0 {
		c.cl.ResumeFetchPartitions(resume)
	}
	c.paused = want
}

// Position is where a reader stands in a topic: the topic's ID (which
// changes when it is deleted and created again) and the next offset of
// each partition.
type Position struct {
	ID   string
	Next map[int32]int64
}

// NewConsumer connects to the brokers.
func NewConsumer(cfg Config) (*Consumer, error) {
	var cl *kgo.Client
	var err error
	// The client's goroutines (fetches, decompression) work for the
	// fetch stage.
	stage.Within(stage.Fetch, func() {
		cl, err = newClient(cfg.Brokers,
			kgo.FetchMaxBytes(16<<20),
			// A little of every partition per fetch, so what arrives keeps
			// pace across partitions and batches can end at watermarks.
			kgo.FetchMaxPartitionBytes(1<<20),
			kgo.FetchMaxWait(200*time.Millisecond),
			kgo.MaxConcurrentFetches(1),
			// Out of range is an error, never a reset to the log start (which
			// would skip what retention deleted).
			kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		)
	})
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, cl: cl, adm: kadm.NewClient(cl), assigned: map[string]bool{}, next: map[string]map[int32]int64{},
		paused: map[TopicPartition]bool{}, high: map[TopicPartition]int64{}}, nil
}

// Close releases the client.
func (c *Consumer) Close() { c.cl.Close() }

// SetSigner makes the consumer take from the meta topics only what
// lakeflow signed (Signer); the rest are strays.
func (c *Consumer) SetSigner(g *Signer) { c.signer = g }

// Watermark reads r, a record of the watermark topic: the watermark, or
// the stray it is.
func (c *Consumer) Watermark(r *kgo.Record) (change.Watermark, *Stray) { return watermark(c.signer, r) }

// Schemas returns the schema records after pos, the records there that
// lakeflow did not write, and the position after them; reset reports
// that the log pos was read from is gone (the topic was deleted, or its
// data reset) and the records are all of the new one.
func (c *Consumer) Schemas(ctx context.Context, pos Position) (recs []SchemaRecord, strays []Stray, next Position, reset bool, err error) {
	return ReadSchemas(ctx, c.cfg.Brokers, c.cl, c.cfg.Prefix, pos, c.signer)
}

// SourceState returns the source's last saved state (nil: none) and the
// state topic's records lakeflow did not write.
func (c *Consumer) SourceState(ctx context.Context) (*change.SourceState, []Stray, error) {
	return loadState(ctx, c.cfg.Brokers, c.cl, c.cfg.Prefix, c.signer)
}

// MetaEnds returns the end offset of each meta topic (0 for one that
// does not exist).
func (c *Consumer) MetaEnds(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	for _, topic := range []string{SchemaTopic(c.cfg.Prefix), StateTopic(c.cfg.Prefix), WatermarkTopic(c.cfg.Prefix)} {
		n, _, err := describeTopic(ctx, c.cl, topic)
		if err != nil {
			return nil, unavailable("describe topic "+topic, err)
		}
		if n == 0 {
			continue
		}
		_, end, err := offsets(ctx, c.adm, topic)
		if err != nil {
			return nil, err
		}
		e, _ := end.Lookup(topic, 0)
		out[topic] = e.Offset
	}
	return out, nil
}

// Assigned reports whether topic is being consumed.
func (c *Consumer) Assigned(topic string) bool { return c.assigned[topic] }

// Assign starts consuming every partition of topic (creating it with
// partitions partitions if it does not exist) at pos, and returns where it
// started. When the log pos was read from is gone — the topic has another
// ID (deleted and created again: the Kafka data was deleted), or it ends
// before pos (its data was reset) — it starts at the beginning of the
// present log and reports reset; the caller must then recognise records
// it already holds by their event positions. A log that starts after pos
// lost records to retention that were never read: that is an error,
// unless they are hints (skippable: the watermarks), then it starts at
// the log's start.
func (c *Consumer) Assign(ctx context.Context, topic string, partitions int, pos Position, hints bool) (Position, bool, error) {
	if _, err := ensureTopic(ctx, c.cl, topic, partitions, tableTopicConfigs()); err != nil {
		return Position{}, false, err
	}
	_, id, err := describeTopic(ctx, c.cl, topic)
	if err != nil {
		return Position{}, false, unavailable("describe topic "+topic, err)
	}
	start, end, err := offsets(ctx, c.adm, topic)
	if err != nil {
		return Position{}, false, err
	}
	reset := pos.ID != "" && pos.ID != id
	end.Each(func(e kadm.ListedOffset) {
		if pos.Next[e.Partition] > e.Offset {
			reset = true
		}
	})
	from := Position{ID: id, Next: map[int32]int64{}}
	var problems []error
	start.Each(func(s kadm.ListedOffset) {
		at := pos.Next[s.Partition]
		switch {
		case reset || (hints && at < s.Offset):
			at = s.Offset
		case at < s.Offset:
			problems = append(problems, fmt.Errorf("%s/%d starts at offset %d but the warehouse has read only up to %d: records it never read were deleted (the topic's own retention, or a warehouse lost or replaced by an older one); lakeflow cannot recover them from Kafka: if the lake holds them, lakeflow backfill --all rebuilds the warehouse from it",
				topic, s.Partition, s.Offset, at))
		}
		from.Next[s.Partition] = at
	})
	if len(problems) > 0 {
		return Position{}, false, fmt.Errorf("%w: %w", fault.ErrUnavailable, errors.Join(problems...))
	}
	parts := map[int32]kgo.Offset{}
	for p, at := range from.Next {
		parts[p] = kgo.NewOffset().At(at)
	}
	c.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts})
	c.assigned[topic] = true
	c.next[topic] = from.Next
	for tp := range c.high {
		if tp.Topic == topic {
			delete(c.high, tp) // an end an earlier topic of that name reported
		}
	}
	return from, reset, nil
}

// topUpWait is how long Poll waits for the fetch that follows a buffered
// one: Kafka answers it at once when it holds records, and otherwise they
// wait for the next poll anyway.
const topUpWait = 20 * time.Millisecond

// Poll waits for records (up to max) until ctx is done or wait passes.
// Every partition's records must follow on without a gap. Behind says
// whether Kafka held more than it returned.
func (c *Consumer) Poll(ctx context.Context, max int, wait time.Duration) ([]*kgo.Record, error) {
	recs, err := c.poll(ctx, max, wait)
	if err != nil || len(recs) == 0 || len(recs) >= max {
		return recs, err
	}
	// The client holds one fetch for each broker and sends the next when
	// that one is taken, so what the first poll returns may have waited
	// while the caller applied a batch: as much again (measured: the
	// newest change of each batch had reached silver 0.7 s after its
	// source commit, for 0.3 s of applying). The next fetch holds what
	// arrived meanwhile.
	more, err := c.poll(ctx, max-len(recs), topUpWait)
	return append(recs, more...), err
}

// poll takes what one fetch returns, waiting at most wait for it.
func (c *Consumer) poll(ctx context.Context, max int, wait time.Duration) ([]*kgo.Record, error) {
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	fetches := c.cl.PollRecords(pctx, max)
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
			continue
		}
		if errors.Is(fe.Err, kerr.OffsetOutOfRange) {
			return nil, fmt.Errorf("%w: kafka: %s/%d: records the warehouse had not read from offset %d on were deleted (retention): lakeflow cannot recover them from Kafka",
				fault.ErrUnavailable, fe.Topic, fe.Partition, c.next[fe.Topic][fe.Partition])
		}
		return nil, unavailable(fmt.Sprintf("fetch %s/%d", fe.Topic, fe.Partition), fe.Err)
	}
	recs := fetches.Records()
	for _, r := range recs {
		want := c.next[r.Topic][r.Partition]
		if r.Offset != want {
			return nil, fmt.Errorf("%w: kafka: %s/%d: records %d to %d are missing (deleted before the warehouse read them); lakeflow cannot recover them from Kafka",
				fault.ErrUnavailable, r.Topic, r.Partition, want, r.Offset-1)
		}
		c.next[r.Topic][r.Partition] = r.Offset + 1
	}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if p.Err == nil && p.HighWatermark >= 0 {
			c.high[TopicPartition{p.Topic, p.Partition}] = p.HighWatermark
		}
	})
	return recs, nil
}

// Behind says whether a partition being fetched held records beyond
// those Poll returned when it last reported its end: the consumer is
// behind, and polling again brings more. A paused partition counts for
// nothing: its records come only once the caller resumes it, so a
// caller that waited for them before deciding would wait for ever (a
// drain, whose last batch waited for a partition it had paused itself,
// stood still until it was cancelled).
func (c *Consumer) Behind() bool {
	for tp, high := range c.high {
		if c.paused[tp] {
			continue
		}
		if next, ok := c.next[tp.Topic][tp.Partition]; ok && high > next {
			return true
		}
	}
	return false
}

// Lag returns, per topic, the records Kafka holds past where the consumer
// stands (as of the last poll's high watermarks).
func (c *Consumer) Lag() map[string]int64 {
	out := make(map[string]int64, len(c.next))
	for tp, high := range c.high {
		if next, ok := c.next[tp.Topic][tp.Partition]; ok {
			out[tp.Topic] += max(high-next, 0)
		}
	}
	return out
}

// EndOffsets returns the end offset of every partition of topics.
func (c *Consumer) EndOffsets(ctx context.Context, topics []string) (map[string]map[int32]int64, error) {
	out := map[string]map[int32]int64{}
	if len(topics) == 0 {
		return out, nil
	}
	_, end, err := offsets(ctx, c.adm, topics...)
	if err != nil {
		return nil, err
	}
	end.Each(func(o kadm.ListedOffset) {
		if out[o.Topic] == nil {
			out[o.Topic] = map[int32]int64{}
		}
		out[o.Topic][o.Partition] = o.Offset
	})
	return out, nil
}
