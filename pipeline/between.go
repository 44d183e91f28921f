package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// The work run --follow does between batches: trimming Kafka, edited
// contracts, pruning the bookkeeping, compacting the lake (the consumer's,
// consume.go).

// pruneInterval is how often the bookkeeping tables are pruned.
const pruneInterval = time.Hour

// compactBusy spaces lakeflow run --follow's compaction passes while
// table-days are left to merge: batches keep the time between.
const compactBusy = 10 * time.Second

// trimInterval is how often committed records are trimmed from Kafka
// (tests shorten it).
var trimInterval = 30 * time.Second

// trim deletes committed records from Kafka now and then (kafka.Trim).
func (c *consumer) trim(ctx context.Context) {
	if time.Since(c.trimmed) < trimInterval {
		return
	}
	c.trimmed = time.Now()
	committed := map[string]map[int32]int64{}
	for topic, pos := range c.committed {
		if topic != kafka.SchemaTopic(c.kcfg.Prefix) {
			committed[topic] = pos.Next
		}
	}
	if n, err := c.kafka.Trim(ctx, committed); err != nil {
		c.log.Warn("trimming Kafka failed; retrying later", "err", err)
	} else if n > 0 {
		c.log.Debug("kafka trimmed", "records", n)
	}
}

// takeContracts gives the warehouse edited contracts, if any came: the
// rules of the batches from now on are theirs.
func (c *consumer) takeContracts(ctx context.Context) error {
	select {
	case set := <-c.edits:
		err := c.wh.SetContracts(statement(ctx), set)
		if err == nil {
			c.contracts = set
			if c.metrics != nil {
				c.metrics.contracts(set)
			}
			return nil
		}
		// A rule the edit wrote that silver cannot run: said, and the
		// run goes on under the rules before (the next start refuses the
		// contract, naming it).
		c.log.Error("the edited contracts' rules cannot run on silver: the rules before stay in force", "err", fault.OneLine(err.Error()))
		return c.wh.SetContracts(statement(ctx), c.contracts)
	default:
		return nil
	}
}

// waitsBetween says whether work that runs between batches is due, for
// which the batch being applied must end first: under a steady load the
// next batch is staged and applied as soon as the last ends, so without
// that wait a due compaction pass or pruning never found a moment (an
// aging run at 5,000 changes/s left a table-day of 1,196 files).
func (c *consumer) waitsBetween() bool {
	f := c.flight
	return len(c.checks) > 0 || len(c.edits) > 0 || c.pruneDue() || c.compactDue() ||
		(f != nil && c.pub.waiting(c.kafka.Behind(), f.batch.Watermark != nil))
}

// pruneDue says whether the bookkeeping tables are to be pruned.
func (c *consumer) pruneDue() bool { return time.Since(c.pruned) >= pruneInterval }

// compactDue says whether a compaction pass of run --follow is due.
func (c *consumer) compactDue() bool {
	return c.follow && c.lake.CompactInterval > 0 && time.Now().After(c.compactAt)
}

// prune bounds the bookkeeping tables (config.Bookkeeping).
func (c *consumer) prune(ctx context.Context) error {
	c.pruned = time.Now()
	p, err := c.wh.Prune(statement(ctx), c.keep, c.pruned)
	if err != nil {
		// Only bookkeeping waits: the changes go on, the next hour
		// tries again (a stop here would recur at every start).
		c.log.Error("pruning the bookkeeping tables failed; they keep their rows until the next try", "err", fault.OneLine(err.Error()), "next", pruneInterval)
		return nil
	}
	if p.Batches+p.Runs+p.Checks > 0 {
		c.log.Info("bookkeeping pruned", "batches_summarized", p.Batches, "runs", p.Runs, "checks", p.Checks)
	}
	// The files compactions replaced go once their grace has passed, also
	// with run --follow's compaction off (lakeflow compact's, then).
	if n, err := c.wh.RemoveCompacted(statement(ctx), c.lake.CompactGrace); err != nil {
		c.log.Error("removing the files compactions replaced failed; they stay until the next try", "err", fault.OneLine(err.Error()), "next", pruneInterval)
	} else if n > 0 {
		c.log.Info("files compactions replaced removed", "compactions", n)
	}
	return nil
}

// compact runs a pass of lakeflow run --follow's compaction between two
// batches: one table-day's small files (today's so far among them), up
// to a merged file's worth; the next pass compactBusy later while files
// are left to merge, a lake.compact_interval later once none is.
func (c *consumer) compact(ctx context.Context) error {
	c.compactAt = time.Now().Add(c.lake.CompactInterval)
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	st, err := c.wh.Compact(statement(ctx), warehouse.CompactOptions{Before: tomorrow,
		Target: c.lake.CompactTarget, Grace: c.lake.CompactGrace, MaxDays: 1, MaxBytes: c.lake.CompactTarget, Incremental: true, After: c.compactAfter})
	if st.Last != "" {
		c.compactAfter = st.Last // the next pass begins with the tables after it
	}
	if errors.Is(err, warehouse.ErrSwapUnfinished) {
		// The warehouse names merged files the lake does not hold yet:
		// the next start swaps them in before anything writes the lake.
		return err
	}
	if err != nil {
		// The lake stays as it was (a day built and not recorded is
		// removed): the changes go on, and the next pass tries again.
		c.log.Error("lake compaction failed: the lake keeps its small files until a later pass", "err", fault.OneLine(err.Error()), "next", c.lake.CompactInterval)
		return nil
	}
	if st.More {
		c.compactAt = time.Now().Add(compactBusy)
	}
	if st.Days > 0 {
		c.log.Info("lake compacted", "files_merged", st.Replaced, "files_written", st.Written)
	}
	return nil
}
