package kafka

import (
	"context"
	"encoding/json"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/change"
)

const stateKey = "source"

// SaveState records the source's state and waits for Kafka to have it.
func (p *Producer) SaveState(ctx context.Context, s change.SourceState) error {
	val, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return p.put(ctx, StateTopic(p.cfg.Prefix), stateKey, val)
}

// LoadState returns the last state lakeflow saved, or nil on a fresh
// pipeline.
func (p *Producer) LoadState(ctx context.Context) (*change.SourceState, error) {
	s, _, err := loadState(ctx, p.cfg.Brokers, p.cl, p.cfg.Prefix, p.cfg.Signer)
	return s, err
}

// loadState returns the last state record lakeflow wrote (nil: none),
// and the records of the state topic it did not write (strays). With a
// signer, lakeflow's records are those it signed; without one (before
// the pipeline's key is known), those signed by the key the first keyed
// record carries, and, before that, every state record (a lakeflow that
// did not sign them wrote those).
func loadState(ctx context.Context, brokers []string, cl *kgo.Client, prefix string, g *Signer) (*change.SourceState, []Stray, error) {
	topic := StateTopic(prefix)
	recs, _, _, err := readMeta(ctx, brokers, cl, topic, Position{})
	if err != nil {
		return nil, nil, err
	}
	var last *change.SourceState
	var strays []Stray
	for _, r := range recs {
		s, signer, stray := stateRecord(g, topic, r)
		if stray != nil {
			strays = append(strays, *stray)
			continue
		}
		last, g = s, signer
	}
	return last, strays, nil
}

// LoadSchemas returns the last recorded schema of every table.
func (p *Producer) LoadSchemas(ctx context.Context) (map[string]*change.Table, error) {
	recs, _, _, _, err := ReadSchemas(ctx, p.cfg.Brokers, p.cl, p.cfg.Prefix, Position{}, p.cfg.Signer)
	if err != nil {
		return nil, err
	}
	out := map[string]*change.Table{}
	for _, r := range recs {
		out[r.Table.ID()] = r.Table
	}
	return out, nil
}

// ReadSchemas reads the schema records after pos and returns them in
// order with the position to continue from; reset reports that the log
// pos was read from is gone and the records are all of the present one.
// Records lakeflow did not write (g says), or that are not schema
// records, are strays.
func ReadSchemas(ctx context.Context, brokers []string, cl *kgo.Client, prefix string, pos Position, g *Signer) ([]SchemaRecord, []Stray, Position, bool, error) {
	topic := SchemaTopic(prefix)
	recs, next, reset, err := readMeta(ctx, brokers, cl, topic, pos)
	if err != nil {
		return nil, nil, pos, false, err
	}
	out := make([]SchemaRecord, 0, len(recs))
	var strays []Stray
	for _, r := range recs {
		sr, stray := schemaRecord(g, topic, r)
		if stray != nil {
			strays = append(strays, *stray)
			continue
		}
		out = append(out, sr)
	}
	return out, strays, next, reset, nil
}

// readMeta reads partition 0 of a meta topic from pos to its end. A
// topic that does not exist yet reads as empty. When the topic is not the
// one pos was read in (another ID, or it ends before pos), it is read
// from its start and reset is true.
func readMeta(ctx context.Context, brokers []string, cl *kgo.Client, topic string, pos Position) ([]metaRecord, Position, bool, error) {
	n, id, err := describeTopic(ctx, cl, topic)
	if err != nil {
		return nil, pos, false, unavailable("describe topic "+topic, err)
	}
	if n == 0 {
		return nil, Position{Next: map[int32]int64{}}, pos.Next[0] > 0, nil
	}
	start, end, err := offsets(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		return nil, pos, false, err
	}
	s, _ := start.Lookup(topic, 0)
	e, _ := end.Lookup(topic, 0)
	from := pos.Next[0]
	reset := (pos.ID != "" && pos.ID != id) || from > e.Offset
	if reset {
		from = 0
	}
	recs, err := readRange(ctx, brokers, topic, 0, max(from, s.Offset), e.Offset)
	if err != nil {
		return nil, pos, false, err
	}
	out := make([]metaRecord, len(recs))
	for i, r := range recs {
		out[i] = metaRecord{offset: r.Offset, key: r.Key, value: r.Value, headers: r.Headers}
	}
	return out, Position{ID: id, Next: map[int32]int64{0: max(from, e.Offset)}}, reset, nil
}
