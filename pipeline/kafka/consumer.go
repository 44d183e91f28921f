package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// Consumer reads table topics at offsets the caller keeps (the warehouse
// stores them in the same transaction as the data), so no consumer group
// is involved.
type Consumer struct {
	cfg      Config
	cl       *kgo.Client
	adm      *kadm.Client
	assigned map[string]bool
}

// NewConsumer connects to the brokers.
func NewConsumer(cfg Config) (*Consumer, error) {
	cl, err := newClient(cfg.Brokers,
		kgo.FetchMaxBytes(16<<20),
		kgo.FetchMaxPartitionBytes(8<<20),
		kgo.FetchMaxWait(200*time.Millisecond),
		kgo.MaxConcurrentFetches(1),
	)
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, cl: cl, adm: kadm.NewClient(cl), assigned: map[string]bool{}}, nil
}

// Close releases the client.
func (c *Consumer) Close() { c.cl.Close() }

// Schemas returns the schema records from offset from on, and the offset
// after them.
func (c *Consumer) Schemas(ctx context.Context, from int64) ([]SchemaRecord, int64, error) {
	return ReadSchemas(ctx, c.cfg.Brokers, c.cl, c.cfg.Prefix, from)
}

// Assigned reports whether topic is being consumed.
func (c *Consumer) Assigned(topic string) bool { return c.assigned[topic] }

// Assign starts consuming every partition of topic, each at its offset in
// next (0 when absent). It refuses offsets the log no longer or not yet
// has: both mean Kafka and the warehouse disagree about history.
func (c *Consumer) Assign(ctx context.Context, topic string, next map[int32]int64) error {
	start, end, err := offsets(ctx, c.adm, topic)
	if err != nil {
		return err
	}
	parts := map[int32]kgo.Offset{}
	var problems []error
	start.Each(func(s kadm.ListedOffset) {
		e, _ := end.Lookup(topic, s.Partition)
		at := next[s.Partition]
		switch {
		case at < s.Offset:
			problems = append(problems, fmt.Errorf("%s/%d starts at offset %d (retention removed older records) but the warehouse has read only up to %d: rebuild the warehouse from the lake",
				topic, s.Partition, s.Offset, at))
		case at > e.Offset:
			problems = append(problems, fmt.Errorf("%s/%d ends at offset %d but the warehouse has read up to %d: the Kafka data was reset; point warehouse.path at a fresh file to rebuild it",
				topic, s.Partition, e.Offset, at))
		}
		parts[s.Partition] = kgo.NewOffset().At(at)
	})
	if len(problems) > 0 {
		return fmt.Errorf("%w: %w", fault.ErrUnavailable, errors.Join(problems...))
	}
	c.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts})
	c.assigned[topic] = true
	return nil
}

// Poll waits for records (up to max) until ctx is done or wait passes.
func (c *Consumer) Poll(ctx context.Context, max int, wait time.Duration) ([]*kgo.Record, error) {
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	fetches := c.cl.PollRecords(pctx, max)
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
			continue
		}
		return nil, unavailable(fmt.Sprintf("fetch %s/%d", fe.Topic, fe.Partition), fe.Err)
	}
	return fetches.Records(), nil
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
