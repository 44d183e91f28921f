package kafka

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// Config is what the producer and consumer need to reach the topics.
type Config struct {
	Brokers        []string
	Prefix         string
	Partitions     int
	Retention      time.Duration
	RetentionBytes int64
	Database       string // the source database, for the envelope
	// Signer signs what the producer writes to the meta topics (nil:
	// nothing is signed).
	Signer *Signer
}

// TableTopic is the topic of a source table, <prefix>.<schema>.<table> as
// Debezium names it, with characters Kafka does not allow in topic names
// mapped to '_' (change.SafeName).
func TableTopic(prefix, schema, table string) string {
	return prefix + "." + change.SafeName(schema) + "." + change.SafeName(table)
}

// WatermarkTopic holds the source's watermarks: the transaction
// boundaries Kafka has acknowledged, with the partitions' end offsets.
func WatermarkTopic(prefix string) string { return prefix + "._watermarks" }

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
// count (an existing topic keeps its own). An existing topic gets the
// given retention settings: records stay until lakeflow trims them.
func ensureTopic(ctx context.Context, cl *kgo.Client, topic string, partitions int, configs map[string]*string) (int, error) {
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopic(ctx, int32(partitions), -1, configs, topic)
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
	var alter []kadm.AlterConfig
	for _, name := range []string{"retention.ms", "retention.bytes"} {
		if v, ok := configs[name]; ok {
			alter = append(alter, kadm.AlterConfig{Op: kadm.SetConfig, Name: name, Value: v})
		}
	}
	if len(alter) > 0 {
		res, err := adm.AlterTopicConfigs(ctx, alter, topic)
		for _, r := range res {
			err = errors.Join(err, r.Err)
		}
		if err != nil {
			return 0, unavailable("set the retention of topic "+topic, err)
		}
	}
	return n, nil
}

// topicPartitions asks the broker (never a cache) how many partitions topic
// has; 0 means it does not exist.
func topicPartitions(ctx context.Context, cl *kgo.Client, topic string) (int, error) {
	n, _, err := describeTopic(ctx, cl, topic)
	return n, err
}

// describeTopic returns topic's partition count and ID (0 and "" when it
// does not exist). The ID tells a topic from one deleted and created
// again under the same name.
func describeTopic(ctx context.Context, cl *kgo.Client, topic string) (int, string, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, "", err
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			if errors.Is(err, kerr.UnknownTopicOrPartition) {
				return 0, "", nil
			}
			return 0, "", err
		}
		return len(t.Partitions), hex.EncodeToString(t.TopicID[:]), nil
	}
	return 0, "", nil
}

// tableTopicConfigs keep records until lakeflow trims them (Trim): the
// broker's own retention would delete records the warehouse has not read.
func tableTopicConfigs() map[string]*string {
	return map[string]*string{
		"retention.ms":      kadm.StringPtr("-1"),
		"retention.bytes":   kadm.StringPtr("-1"),
		"max.message.bytes": kadm.StringPtr(strconv.Itoa(MaxMessageBytes)),
	}
}

// metaTopicConfigs keep the latest record per key forever.
func metaTopicConfigs() map[string]*string {
	return map[string]*string{
		"cleanup.policy":    kadm.StringPtr("compact"),
		"retention.ms":      kadm.StringPtr("-1"),
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
	cl, err := newClient(brokers, kgo.ConsumeResetOffset(kgo.NoResetOffset()), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
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
