package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// Config is what the producer and consumer need to reach the topics.
type Config struct {
	Brokers        []string
	Prefix         string
	Partitions     int
	Retention      time.Duration
	RetentionBytes int64
	Database       string // the source database, for the envelope
}

// TableTopic is the topic of a source table, as Debezium names it.
func TableTopic(prefix, schema, table string) string { return prefix + "." + schema + "." + table }

// StateTopic holds the source's own state (slot, snapshot progress).
func StateTopic(prefix string) string { return prefix + "._state" }

// SchemaTopic holds every table schema the source recorded, keyed by
// schema.table; the consumer creates and evolves silver tables from it.
func SchemaTopic(prefix string) string { return prefix + "._schemas" }

func newClient(brokers []string, opts ...kgo.Opt) (*kgo.Client, error) {
	// kadm answers topic and offset questions from a metadata cache that
	// lives MetadataMinAge (5s by default); lakeflow creates topics and
	// asks about them right away, so the cache is kept short.
	base := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(20 * time.Millisecond)}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka client: %v", fault.ErrConfig, err)
	}
	return cl, nil
}

// ensureTopic creates topic if it does not exist and returns its partition
// count (an existing topic keeps its own).
func ensureTopic(ctx context.Context, cl *kgo.Client, topic string, partitions int, configs map[string]*string) (int, error) {
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(partitions), -1, configs, topic)
	switch {
	case err == nil:
		return int(resp.NumPartitions), nil
	case !errors.Is(err, kerr.TopicAlreadyExists):
		return 0, unavailable("create topic "+topic, err)
	}
	n, err := topicPartitions(ctx, cl, topic)
	if err == nil && n == 0 {
		err = errors.New("it exists but has no partitions")
	}
	if err != nil {
		return 0, unavailable("describe topic "+topic, err)
	}
	return n, nil
}

// topicPartitions asks the broker (never a cache) how many partitions topic
// has; 0 means it does not exist.
func topicPartitions(ctx context.Context, cl *kgo.Client, topic string) (int, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, err
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			if errors.Is(err, kerr.UnknownTopicOrPartition) {
				return 0, nil
			}
			return 0, err
		}
		return len(t.Partitions), nil
	}
	return 0, nil
}

func tableTopicConfigs(cfg Config) map[string]*string {
	return map[string]*string{
		"retention.ms":      kadm.StringPtr(strconv.FormatInt(cfg.Retention.Milliseconds(), 10)),
		"retention.bytes":   kadm.StringPtr(strconv.FormatInt(cfg.RetentionBytes, 10)),
		"max.message.bytes": kadm.StringPtr(strconv.Itoa(MaxMessageBytes)),
	}
}

// metaTopicConfigs keep the latest record per key forever.
func metaTopicConfigs() map[string]*string {
	return map[string]*string{
		"cleanup.policy":    kadm.StringPtr("compact"),
		"max.message.bytes": kadm.StringPtr(strconv.Itoa(MaxMessageBytes)),
	}
}

func unavailable(what string, err error) error {
	return fmt.Errorf("%w: kafka: %s: %v", fault.ErrUnavailable, what, err)
}

// readRange returns the records of topic/partition in [from, to).
func readRange(ctx context.Context, brokers []string, topic string, partition int32, from, to int64) ([]*kgo.Record, error) {
	if from >= to {
		return nil, nil
	}
	cl, err := newClient(brokers, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
		topic: {partition: kgo.NewOffset().At(from)},
	}))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return nil, unavailable(fmt.Sprintf("read %s/%d", topic, partition), errs[0].Err)
		}
		for it := fetches.RecordIter(); !it.Done(); {
			r := it.Next()
			if r.Offset >= to {
				return out, nil
			}
			out = append(out, r)
			if r.Offset == to-1 {
				return out, nil
			}
		}
	}
}

// offsets lists start and end offsets of every partition of topics. A
// topic created a moment ago can be unknown to a metadata cache for a few
// milliseconds; that is retried.
func offsets(ctx context.Context, adm *kadm.Client, topics ...string) (start, end kadm.ListedOffsets, err error) {
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		start, end, err = listOffsets(ctx, adm, topics)
		if err == nil || !errors.Is(err, kerr.UnknownTopicOrPartition) || wait > time.Second {
			break
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	if err != nil {
		return nil, nil, unavailable("list offsets", err)
	}
	return start, end, nil
}

func listOffsets(ctx context.Context, adm *kadm.Client, topics []string) (start, end kadm.ListedOffsets, err error) {
	if start, err = adm.ListStartOffsets(ctx, topics...); err != nil {
		return nil, nil, err
	}
	if end, err = adm.ListEndOffsets(ctx, topics...); err != nil {
		return nil, nil, err
	}
	if err := start.Error(); err != nil {
		return nil, nil, err
	}
	return start, end, end.Error()
}
