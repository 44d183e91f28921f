package kafka

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/pipeline/change"
	"github.com/lakeflow/lakeflow/pipeline/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
)

const stateKey = "source"

// SaveState records the source's state and waits for Kafka to have it.
func (p *Producer) SaveState(ctx context.Context, s postgres.State) error {
	val, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return p.put(ctx, StateTopic(p.cfg.Prefix), stateKey, val)
}

// LoadState returns the last saved state, or nil on a fresh pipeline.
func (p *Producer) LoadState(ctx context.Context) (*postgres.State, error) {
	recs, _, err := readMeta(ctx, p.cfg.Brokers, p.cl, StateTopic(p.cfg.Prefix), 0)
	if err != nil || len(recs) == 0 {
		return nil, err
	}
	var s postgres.State
	if err := json.Unmarshal(recs[len(recs)-1].value, &s); err != nil {
		return nil, fmt.Errorf("%w: topic %s holds an unreadable state record: %v", fault.ErrUnavailable, StateTopic(p.cfg.Prefix), err)
	}
	return &s, nil
}

// LoadSchemas returns the last recorded schema of every table.
func (p *Producer) LoadSchemas(ctx context.Context) (map[string]*change.Table, error) {
	recs, _, err := ReadSchemas(ctx, p.cfg.Brokers, p.cl, p.cfg.Prefix, 0)
	if err != nil {
		return nil, err
	}
	out := map[string]*change.Table{}
	for _, r := range recs {
		out[r.Table.ID()] = r.Table
	}
	return out, nil
}

// ReadSchemas reads schema records from offset from on and returns them
// in order with the offset to continue from.
func ReadSchemas(ctx context.Context, brokers []string, cl *kgo.Client, prefix string, from int64) ([]SchemaRecord, int64, error) {
	topic := SchemaTopic(prefix)
	recs, next, err := readMeta(ctx, brokers, cl, topic, from)
	if err != nil {
		return nil, from, err
	}
	out := make([]SchemaRecord, 0, len(recs))
	for _, r := range recs {
		var sr SchemaRecord
		if err := json.Unmarshal(r.value, &sr); err != nil || sr.Table == nil {
			return nil, from, fmt.Errorf("%w: topic %s offset %d is not a schema record: %v", fault.ErrUnavailable, topic, r.offset, err)
		}
		out = append(out, sr)
	}
	return out, next, nil
}

type metaRecord struct {
	offset int64
	value  []byte
}

// readMeta reads partition 0 of a meta topic from offset from to its end.
// A topic that does not exist yet reads as empty.
func readMeta(ctx context.Context, brokers []string, cl *kgo.Client, topic string, from int64) ([]metaRecord, int64, error) {
	n, err := topicPartitions(ctx, cl, topic)
	if err != nil {
		return nil, from, unavailable("describe topic "+topic, err)
	}
	if n == 0 {
		return nil, from, nil
	}
	start, end, err := offsets(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		return nil, from, err
	}
	s, _ := start.Lookup(topic, 0)
	e, _ := end.Lookup(topic, 0)
	recs, err := readRange(ctx, brokers, topic, 0, max(from, s.Offset), e.Offset)
	if err != nil {
		return nil, from, err
	}
	out := make([]metaRecord, len(recs))
	for i, r := range recs {
		out[i] = metaRecord{offset: r.Offset, value: r.Value}
	}
	return out, max(from, e.Offset), nil
}
