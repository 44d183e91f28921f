package kafka

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DeadLetterTopic is where events that cannot be applied are announced.
func DeadLetterTopic(prefix string) string { return prefix + ".dlq" }

// DeadLetter is an event the warehouse set aside.
type DeadLetter struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Table     string `json:"table,omitempty"`
	Stage     string `json:"failure_stage"`
	Reason    string `json:"failure_reason"`
	// Payload is the record's value as it was (base64 in JSON).
	Payload []byte `json:"payload"`
}

// DeadLetters announces dead letters on <prefix>.dlq, keyed by their
// topic, partition and offset. The warehouse and the lake hold them
// exactly; the topic is for alerting and other consumers.
func (c *Consumer) DeadLetters(ctx context.Context, dead []DeadLetter) error {
	topic := DeadLetterTopic(c.cfg.Prefix)
	if _, err := ensureTopic(ctx, c.cl, topic, 1, nil); err != nil {
		return err
	}
	recs := make([]*kgo.Record, len(dead))
	for i, d := range dead {
		val, err := json.Marshal(d)
		if err != nil {
			return err
		}
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("%s/%d/%d", d.Topic, d.Partition, d.Offset)), Value: val}
	}
	if err := c.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return unavailable("write "+topic, err)
	}
	return nil
}
