package pipeline

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// signing is how the pipeline's records on its meta topics are signed
// (kafka.Signer), established before the source and the consumer start.
type signing struct {
	signer *kafka.Signer
	// key is the pipeline's key, which a source state the snapshot makes
	// records.
	key string
	// introduced is a state that predates signing, now with a key: the
	// source must save it before anything else.
	introduced *change.SourceState
	// strays are the state topic's records lakeflow did not write that
	// lakeflow.dlq does not hold yet.
	strays []warehouse.DeadLetter
}

// establishSigning finds the pipeline's key: the warehouse's copy of the
// source state says it, else the state in Kafka; a first run makes one,
// and so does a pipeline whose state predates signing (its records so
// far are trusted: signing starts at each meta topic's end).
func establishSigning(ctx context.Context, cons *kafka.Consumer, wh *warehouse.Warehouse, fallback *change.SourceState, log *slog.Logger) (signing, error) {
	var sg signing
	if fallback != nil && fallback.Key != "" {
		g, err := kafka.NewSigner(fallback)
		if err != nil {
			return sg, fmt.Errorf("%w: lakeflow.source_state: %v", fault.ErrConfig, err)
		}
		cons.SetSigner(g)
	}
	state, strays, err := cons.SourceState(ctx)
	if err != nil {
		return sg, err
	}
	for _, s := range strays {
		seen, err := wh.Dead(ctx, s.Topic, s.Partition, s.Offset)
		if err != nil {
			return sg, err
		}
		if !seen {
			log.Warn("a record lakeflow did not write is set aside as a dead letter", "topic", s.Topic, "offset", s.Offset, "reason", s.Reason)
			sg.strays = append(sg.strays, deadStray(s))
		}
	}
	if state == nil {
		state = fallback
	}
	switch {
	case state == nil:
		state = &change.SourceState{Key: kafka.NewKey()}
	case state.Key == "":
		ends, err := cons.MetaEnds(ctx)
		if err != nil {
			return sg, err
		}
		keyed := *state
		keyed.Key, keyed.SignedFrom = kafka.NewKey(), ends
		sg.introduced, state = &keyed, &keyed
		log.Info("lakeflow signs its records on the meta topics from now on", "from", ends)
	}
	sg.key = state.Key
	if sg.signer, err = kafka.NewSigner(state); err != nil {
		return sg, fmt.Errorf("%w: the source state in Kafka: %v", fault.ErrConfig, err)
	}
	cons.SetSigner(sg.signer)
	return sg, nil
}
