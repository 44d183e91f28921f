package kafka

import (
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/change"
)

// The three meta topics carry records anyone with access to the broker
// can write. Each is read here, apart from Kafka, so that what lakeflow
// takes from them is decided in one place (and fuzzed): a record is taken
// only when it parses as its topic's kind and g says lakeflow wrote it;
// any other is a Stray, never an error that stops the reader.

type metaRecord struct {
	offset     int64
	key, value []byte
	headers    []kgo.RecordHeader
}

func (r metaRecord) stray(topic, reason string) *Stray {
	return &Stray{Topic: topic, Offset: r.offset, Value: r.value, Reason: reason}
}

// watermark reads a record of the watermark topic.
func watermark(g *Signer, r *kgo.Record) (change.Watermark, *Stray) {
	var w change.Watermark
	if err := json.Unmarshal(r.Value, &w); err != nil {
		return w, &Stray{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Value: r.Value, Reason: "not a watermark: " + err.Error()}
	}
	if !g.Signed(r) {
		return w, &Stray{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Value: r.Value, Reason: "not signed by this pipeline: another client wrote it"}
	}
	return w, nil
}

// schemaRecord reads a record of the schema topic.
func schemaRecord(g *Signer, topic string, r metaRecord) (SchemaRecord, *Stray) {
	var sr SchemaRecord
	err := json.Unmarshal(r.value, &sr)
	switch {
	case err != nil || sr.Table == nil || sr.Topic == "" || len(sr.Table.Columns) == 0 || string(r.key) != sr.Table.ID():
		return sr, r.stray(topic, fmt.Sprintf("not a schema record: %v", err))
	case !g.signed(topic, r.offset, r.key, r.value, r.headers):
		return sr, r.stray(topic, "not signed by this pipeline: another client wrote it")
	}
	return sr, nil
}

// stateRecord reads a record of the state topic. Without a signer (the
// pipeline's key is not known yet) the first keyed record names it; the
// signer returned is the one to read the next record with.
func stateRecord(g *Signer, topic string, r metaRecord) (*change.SourceState, *Signer, *Stray) {
	var s change.SourceState
	err := json.Unmarshal(r.value, &s)
	signer := g
	if err == nil && signer == nil && s.Key != "" {
		signer, err = NewSigner(&s)
	}
	switch {
	case err != nil || s.Slot == "":
		return nil, g, r.stray(topic, fmt.Sprintf("not a source state record: %v", err))
	case !signer.signed(topic, r.offset, r.key, r.value, r.headers):
		return nil, g, r.stray(topic, "not signed by this pipeline: another client wrote it")
	}
	return &s, signer, nil
}
