package pipeline

import (
	"context"
	"log/slog"
	"maps"
	"sync/atomic"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/config"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// finishTimeout bounds the last batch applied after a cancel.
const finishTimeout = time.Minute

// consumer moves records from Kafka into the lake and the warehouse, one
// batch (one DuckDB transaction) at a time.
type consumer struct {
	cfg        config.Pipeline
	prefix     string // topic prefix
	kafka      *kafka.Consumer
	wh         *warehouse.Warehouse
	log        *slog.Logger
	follow     bool
	sourceDone <-chan struct{}

	// applied and seen are, per topic and partition, the next offset after
	// what is committed and after what is held (committed or pending).
	applied map[string]map[int32]int64
	seen    map[string]map[int32]int64
	pending []warehouse.Record
	bytes   int64
	opened  time.Time
	synced  time.Time
	stats   consumerStats
}

type consumerStats struct {
	events, batches, files atomic.Int64
}

// run consumes until ctx is cancelled (then applies what it holds and
// returns ctx's error) or, without follow, until the source has finished
// and everything it produced is applied.
func (c *consumer) run(ctx context.Context) error {
	c.applied, c.seen = map[string]map[int32]int64{}, map[string]map[int32]int64{}
	if err := c.syncSchemas(ctx); err != nil {
		return err
	}
	var target map[string]map[int32]int64
	sourceDone := c.sourceDone
	for {
		if ctx.Err() != nil {
			return c.finish(ctx.Err())
		}
		if target == nil && sourceDone != nil && !c.follow {
			select {
			case <-sourceDone:
				// The source has delivered everything: read where Kafka
				// ends now and stop once that is applied.
				sourceDone = nil
				if err := c.syncSchemas(ctx); err != nil {
					return err
				}
				var err error
				if target, err = c.kafka.EndOffsets(ctx, c.wh.Topics()); err != nil {
					return err
				}
			default:
			}
		}
		if target != nil && len(c.pending) == 0 && reached(c.applied, target) {
			return nil
		}
		// New tables show up in the schema topic; look while idle.
		if len(c.pending) == 0 && time.Since(c.synced) >= c.cfg.BatchInterval {
			if err := c.syncSchemas(ctx); err != nil {
				if ctx.Err() != nil {
					return c.finish(ctx.Err())
				}
				return err
			}
		}
		wait := c.cfg.BatchInterval
		if len(c.pending) > 0 {
			wait = max(time.Until(c.opened.Add(c.cfg.BatchInterval)), time.Millisecond)
		}
		recs, err := c.kafka.Poll(ctx, c.cfg.BatchEvents-len(c.pending), wait)
		if err != nil {
			if ctx.Err() != nil {
				return c.finish(ctx.Err())
			}
			return err
		}
		for _, r := range recs {
			if len(c.pending) == 0 {
				c.opened = time.Now()
			}
			c.pending = append(c.pending, warehouse.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Value: r.Value})
			c.bytes += int64(len(r.Value))
			c.seen[r.Topic][r.Partition] = max(c.seen[r.Topic][r.Partition], r.Offset+1)
		}
		full := len(c.pending) >= c.cfg.BatchEvents || c.bytes >= c.cfg.BatchBytes ||
			(len(c.pending) > 0 && time.Since(c.opened) >= c.cfg.BatchInterval)
		if full || (target != nil && len(c.pending) > 0 && reached(c.seen, target)) {
			if err := c.apply(ctx); err != nil {
				if ctx.Err() != nil {
					return c.finish(ctx.Err())
				}
				return err
			}
		}
	}
}

// finish applies the in-flight batch under a fresh, bounded context.
func (c *consumer) finish(cause error) error {
	if len(c.pending) == 0 {
		return cause
	}
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	if err := c.apply(ctx); err != nil {
		return err
	}
	return cause
}

func (c *consumer) apply(ctx context.Context) error {
	// Schema records are acknowledged before the events that need them,
	// so reading the schema topic now covers everything in the batch.
	if err := c.syncSchemas(ctx); err != nil {
		return err
	}
	st, err := c.wh.Apply(ctx, c.pending)
	if err != nil {
		return err
	}
	for topic, parts := range c.seen {
		for p, off := range parts {
			c.applied[topic][p] = off
		}
	}
	c.stats.events.Add(int64(st.Events))
	c.stats.batches.Add(1)
	c.stats.files.Add(int64(st.LakeFiles))
	c.log.Debug("batch committed", "events", st.Events, "tables", st.Tables, "lake_files", st.LakeFiles,
		"stage", st.Stage.Round(time.Millisecond), "decode", st.Decode.Round(time.Millisecond), "lake", st.Lake.Round(time.Millisecond),
		"merge", st.Merge.Round(time.Millisecond), "commit", st.Commit.Round(time.Millisecond))
	c.pending = c.pending[:0]
	c.bytes = 0
	return nil
}

// syncSchemas creates or evolves silver tables from new schema records and
// starts consuming new topics at the warehouse's offsets.
func (c *consumer) syncSchemas(ctx context.Context) error {
	c.synced = time.Now()
	topic := kafka.SchemaTopic(c.prefix)
	from, err := c.wh.Offsets(ctx, topic)
	if err != nil {
		return err
	}
	recs, next, err := c.kafka.Schemas(ctx, from[0])
	if err != nil {
		return err
	}
	if len(recs) > 0 {
		schemas := make([]warehouse.Schema, len(recs))
		for i, r := range recs {
			schemas[i] = warehouse.Schema{Topic: r.Topic, Table: r.Table}
		}
		if err := c.wh.ApplySchemas(ctx, schemas, topic, next); err != nil {
			return err
		}
	}
	for _, t := range c.wh.Topics() {
		if c.kafka.Assigned(t) {
			continue
		}
		offsets, err := c.wh.Offsets(ctx, t)
		if err != nil {
			return err
		}
		if err := c.kafka.Assign(ctx, t, offsets); err != nil {
			return err
		}
		c.applied[t], c.seen[t] = offsets, maps.Clone(offsets)
	}
	return nil
}

// reached reports whether offs is at or past target everywhere.
func reached(offs, target map[string]map[int32]int64) bool {
	for topic, parts := range target {
		for p, end := range parts {
			if offs[topic][p] < end {
				return false
			}
		}
	}
	return true
}
