package pipeline

import (
	"context"
	"encoding/json"
	"maps"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// The schema topic and the topics it names: silver tables made or evolved,
// the source state's copy, where each topic is read from (the consumer's,
// consume.go).

// syncSchemas creates or evolves silver tables from new schema records,
// keeps a copy of the source's state, and starts consuming new topics at
// the warehouse's positions.
func (c *consumer) syncSchemas(ctx context.Context) error {
	c.synced = time.Now()
	topic := kafka.SchemaTopic(c.kcfg.Prefix)
	// Look at the schema topic alone first: the warehouse is busy with
	// a batch, or an idle pipeline looks every batch_interval, where a
	// statement each time was most of what idling cost. Only when it
	// has moved, wait for the batch and read from the warehouse's
	// position.
	recs, strays, _, reset, err := c.kafka.Schemas(ctx, c.schemaNext)
	if err != nil {
		return err
	}
	// (The first look reads the warehouse's position, and assigns the
	// topics it knows, whatever the schema topic holds.)
	moved := len(recs)+len(strays) > 0 || reset || c.schemaNext.Next == nil
	stale := c.stateSaved.Swap(false) || c.stateCopy == nil || !c.stateCopy.Snapshotted || c.stateCopy.Slot != c.slot
	if !moved && stale {
		// During a snapshot: has the source's state moved on?
		state, _, err := c.kafka.SourceState(ctx)
		if err != nil {
			return err
		}
		moved = state != nil && (c.stateCopy == nil || !equalState(state, c.stateCopy))
	}
	if !moved {
		return nil
	}
	if err := c.settle(ctx); err != nil {
		return err
	}
	from, err := c.wh.Offsets(statement(ctx), topic)
	if err != nil {
		return err
	}
	recs, strays, next, reset, err := c.kafka.Schemas(ctx, kafka.Position(from))
	if err != nil {
		return err
	}
	var dead []warehouse.DeadLetter
	for _, st := range strays {
		c.log.Warn("a record lakeflow did not write is set aside as a dead letter", "topic", st.Topic, "offset", st.Offset, "reason", st.Reason)
		dead = append(dead, deadStray(st))
	}
	c.schemaNext = next
	if reset {
		c.log.Warn("the schema topic was deleted or reset; reading it again from its start", "topic", topic)
	}
	var state *change.SourceState
	if stale {
		if state, _, err = c.kafka.SourceState(ctx); err != nil {
			return err
		}
		if state != nil && c.stateCopy != nil && equalState(state, c.stateCopy) {
			state = nil
		}
	}
	if len(recs)+len(dead) > 0 || state != nil || reset {
		schemas := make([]warehouse.Schema, len(recs))
		for i, r := range recs {
			schemas[i] = warehouse.Schema{Topic: r.Topic, Table: r.Table}
		}
		if err := c.wh.ApplySchemas(statement(ctx), schemas, topic, warehouse.TopicPosition(next), state, dead); err != nil {
			return err
		}
		if len(dead) > 0 {
			c.deadLetters(ctx, dead)
		}
		if state != nil {
			c.stateCopy = state
		}
	}
	for _, t := range c.wh.Topics() {
		if err := c.assign(ctx, t, c.kcfg.Partitions); err != nil {
			return err
		}
	}
	return nil
}

func equalState(a, b *change.SourceState) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// assign starts consuming topic at the warehouse's position. When the
// log the warehouse read is gone (Kafka's data was deleted, or the topic
// is new to it under a new prefix), it reads the present log from its
// start and the warehouse recognises what it holds by event position.
func (c *consumer) assign(ctx context.Context, topic string, partitions int) error {
	if c.kafka.Assigned(topic) {
		return nil
	}
	stored, err := c.wh.Offsets(statement(ctx), topic)
	if err != nil {
		return err
	}
	// Watermarks are hints: one trimmed before the warehouse read it
	// (a warehouse rebuilt from the lake) bounded only records the
	// warehouse holds.
	from, reset, err := c.kafka.Assign(ctx, topic, partitions, kafka.Position(stored), topic == c.wmTopic())
	if err != nil {
		return err
	}
	if reset {
		c.log.Warn("the Kafka log the warehouse read is gone (its data was deleted or reset); reading the present one from its start, skipping the events the lake and silver hold",
			"topic", topic, "warehouse_at", c.wh.Floor())
	}
	if topic != c.wmTopic() {
		if err := c.wh.ReadingTopic(statement(ctx), topic, from.ID); err != nil {
			return err
		}
	}
	pos := warehouse.TopicPosition(from)
	c.committed[topic], c.seen[topic] = clonePosition(pos), clonePosition(pos)
	for tp := range c.last {
		if tp.Topic == topic {
			delete(c.last, tp) // a position an earlier log of the topic reported
		}
	}
	if reset {
		c.reset[topic] = true
	}
	if topic == c.wmTopic() {
		// Watermarks not yet read leave each partition where the last
		// batch that ended at a mark left its bound (a batch takes the
		// records up to its mark's position: its bounds may hold later
		// ones, which a later batch takes).
		for t, p := range c.committed {
			if t == c.wmTopic() {
				continue
			}
			c.bounds[t] = maps.Clone(p.Next)
			if c.reset[t] {
				continue // the bounds of a log that is gone
			}
			stored, err := c.wh.Bounds(statement(ctx), t)
			if err != nil {
				return err
			}
			for part, b := range stored {
				c.bounds[t][part] = max(c.bounds[t][part], b)
			}
			c.savedBounds[t] = stored
		}
		c.marks = nil
	} else if reset || c.bounds[topic] == nil {
		// A watermark read before the topic was assigned knows better.
		c.bounds[topic] = maps.Clone(pos.Next)
	}
	return nil
}

func clonePosition(p warehouse.TopicPosition) warehouse.TopicPosition {
	return warehouse.TopicPosition{ID: p.ID, Next: maps.Clone(p.Next)}
}

// reached reports whether positions are at or past target everywhere.
func reached(pos map[string]warehouse.TopicPosition, target map[string]map[int32]int64) bool {
	for topic, parts := range target {
		for p, end := range parts {
			if pos[topic].Next[p] < end {
				return false
			}
		}
	}
	return true
}
