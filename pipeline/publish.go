package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/internal/stage"
	"github.com/lakeflow/lakeflow/warehouse"
)

// ensureLive makes sure the live warehouse exists where one exists at
// all: a data directory of a lakeflow that wrote warehouse.path itself,
// or whose live file is lost, goes on from the published one (a
// consistent warehouse; what the lake holds beyond it is recognised).
// The file's write-ahead log, if a crash left one, comes along.
func ensureLive(cfg *config.Config, log *slog.Logger) error {
	w := cfg.Warehouse
	if _, err := os.Stat(w.Live); err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if _, err := os.Stat(w.Path); errors.Is(err, os.ErrNotExist) {
		return nil // a new warehouse
	}
	log.Info("the live warehouse starts from warehouse.path", "live", w.Live, "from", w.Path)
	// A log is replayed onto whatever file it sits beside: the live one
	// gets warehouse.path's, or none.
	err := copyFile(w.Path+".wal", w.Live+".wal")
	if errors.Is(err, os.ErrNotExist) {
		err = os.Remove(w.Live + ".wal")
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("%w: copy %s.wal: %v", fault.ErrEnvironment, w.Path, err)
	}
	if err := copyFile(w.Path, w.Live); err != nil {
		os.Remove(w.Live + ".wal")
		return fmt.Errorf("%w: copy %s to %s: %v", fault.ErrEnvironment, w.Path, w.Live, err)
	}
	// warehouse.path's own log now belongs to the live file.
	if err := os.Remove(w.Path + ".wal"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	return lake.Sync(filepath.Dir(w.Live))
}

// publishWhole publishes the live warehouse for a command that changed
// it beside the runs (compact, a backfill of days), unless its last
// batch holds part of a source transaction (a run stopped while applying
// one in parts): readers keep the copy they have, which held whole
// transactions, and the next run, which completes the transaction,
// publishes.
func publishWhole(ctx context.Context, wh *warehouse.Warehouse, path string, log *slog.Logger) error {
	if !wh.Consistent() {
		leftAsItWas(log)
		return nil
	}
	_, err := wh.Publish(ctx, path)
	return err
}

// leftAsItWas says why warehouse.path was not published.
func leftAsItWas(log *slog.Logger) {
	log.Info("warehouse.path is left as it was: the live warehouse ends inside a source transaction, which the next lakeflow run completes and publishes")
}

// copyFile copies src to dst durably, under a temporary name first.
func copyFile(src, dst string) error {
	tmp := dst + ".copying"
	_, err := lake.Copy(src, tmp)
	if err == nil {
		err = lake.Sync(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// publisher publishes the live warehouse to warehouse.path every
// publish_interval, four times as long as publishing took (so it never
// takes more than a fifth of the machine's time), or ten times as long as
// the copy held batches up, whichever is longest. The live file's
// checkpoint and its copy are made between batches (a batch that updates
// rows would wait for a checkpoint running beside it anyway), the copy's
// record, sync and rename in a goroutine of its own while batches go on
// being applied (warehouse.Copy). While the consumer is behind (a
// backlog), copies are backlogCopies times rarer: one made mid-backlog is
// stale within seconds (when a copy cost a tenth of a core, copies every
// 5 s cost the bench's backlog run with history and gold a tenth of its
// pace). Each copy's marts refreshed with every batch are recomputed as
// of it beside the batches that follow (warehouse.DeferGold, Copy.Publish):
// the batches' work, moved, which the copy's cost leaves out.
type publisher struct {
	wh       *warehouse.Warehouse
	path     string
	interval time.Duration
	// next is when a copy is due; nextBehind, while the consumer is
	// behind.
	next, nextBehind time.Time
	log              *slog.Logger
	metrics          *metrics
	// running gets the outcome of copy, being published (nil: none).
	running chan error
	copy    *warehouse.Copy
	// gold is the time refreshing the marts for copies took.
	gold time.Duration
	// advised: the run said once that its copies write the whole file.
	advised bool
}

// adviseAbove is the size from which a copy that writes every byte of the
// warehouse is worth a word: beyond it, the copy holds batches up for
// seconds (about 2 s a GB on ext4) where a clone takes milliseconds.
const adviseAbove = 1 << 30

// backlogCopies is how many times rarer copies are while the consumer is
// behind.
const backlogCopies = 6

// due makes a copy if none is being published, the interval has passed (a
// longer one if the consumer is behind) and batches were committed since
// the last copy, the last of them consistent (a copy holds no transaction
// in part), and starts publishing it; and takes in the outcome of the
// copy published. A copy that fails is retried after an interval: the
// pipeline goes on (readers keep the last copy).
func (p *publisher) due(ctx context.Context, behind bool) error {
	if p == nil {
		return nil
	}
	if p.running != nil {
		select {
		case err := <-p.running:
			switch err = p.taken(err); {
			case errors.Is(err, warehouse.ErrMidTransaction):
				// A batch cut inside a large transaction committed since:
				// the copy waits for the batch that ends it.
			case errors.Is(err, warehouse.ErrGold):
				// A mistake in a mart's SQL or in the data it reads: the
				// run stops, as it did when batches refreshed the mart.
				return err
			case err != nil:
				return p.failed(ctx, err)
			}
		default:
			return nil
		}
	}
	next := p.next
	if behind {
		next = p.nextBehind
	}
	if time.Now().Before(next) || !p.wh.Unpublished() || !p.wh.Consistent() {
		return nil
	}
	stage.Enter(stage.Publish)
	c, err := p.wh.Capture(ctx, p.path, true)
	stage.Enter(stage.Fetch) // the consumer loop's, between batches
	if err != nil {
		return p.failed(ctx, err)
	}
	done := make(chan error, 1)
	p.running, p.copy = done, c
	go func() {
		stage.Enter(stage.Publish)
		done <- p.publish(ctx, c)
	}()
	return nil
}

// waiting says whether due has something to do that the batch being
// applied must end for: the outcome of the copy published, or a copy due
// by the clock that the batch, consistent or not, would allow (due asks
// the warehouse, which the batch is changing meanwhile).
func (p *publisher) waiting(behind, consistent bool) bool {
	if p == nil {
		return false
	}
	if p.running != nil {
		return len(p.running) > 0
	}
	next := p.next
	if behind {
		next = p.nextBehind
	}
	return consistent && !time.Now().Before(next)
}

// refresh refreshes the marts that wait for the next copy now, before
// the run's record, which then counts the time, rather than in the final
// copy's publishing. The copy in flight goes first: its refresh writes
// what this one would.
func (p *publisher) refresh(ctx context.Context) error {
	p.wait()
	stage.Enter(stage.Gold)
	took, err := p.wh.RefreshDeferred(ctx)
	p.counted(took)
	return err
}

// taken takes in the outcome err of the copy in flight: the time its
// marts' refresh took counts as the run's.
func (p *publisher) taken(err error) error {
	p.counted(p.copy.Gold)
	p.running, p.copy = nil, nil
	return err
}

// counted adds the time refreshing marts for a copy took to the run's
// gold time.
func (p *publisher) counted(took time.Duration) {
	if took > 0 {
		p.gold += took
		p.log.Debug("gold marts refreshed", "gold", took.Round(time.Millisecond))
	}
}

// failed logs a copy that failed and retries after an interval, unless
// the run is ending.
func (p *publisher) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	p.log.Warn("warehouse.path not published; retrying later", "err", err)
	p.next = time.Now().Add(p.interval)
	p.nextBehind = p.next
	return nil
}

// publish finishes publishing the copy c and sets when the next copy is
// due.
func (p *publisher) publish(ctx context.Context, c *warehouse.Copy) error {
	if err := c.Publish(ctx); err != nil {
		return err
	}
	if !c.Cloned && c.Bytes > adviseAbove && !p.advised {
		p.advised = true
		p.log.Warn("each copy of the warehouse writes all of it: the file system under warehouse.live_path cannot clone files; on XFS or btrfs a copy costs what changed since the last (see docs/tables.md: a large warehouse belongs on a file system that clones files)",
			"bytes", c.Bytes, "held", c.Held.Round(time.Millisecond))
	}
	p.scheduled(c.Took, c.Held, c.Batch, c.Cloned)
	return nil
}

// scheduled sets when the next copy is due after one of batch that took
// took and held batches up for held.
func (p *publisher) scheduled(took, held time.Duration, batch int64, cloned bool) {
	wait := max(4*took, 10*held)
	p.next = time.Now().Add(max(p.interval, wait))
	p.nextBehind = time.Now().Add(max(backlogCopies*p.interval, wait))
	if p.metrics != nil {
		p.metrics.copied()
	}
	p.log.Debug("warehouse published", "path", p.path, "took", took.Round(time.Millisecond), "held", held.Round(time.Millisecond), "batch", batch, "cloned", cloned)
}

// wait waits for the copy in flight, if any: the warehouse must not be
// closed under it.
func (p *publisher) wait() {
	if p.running != nil {
		if err := p.taken(<-p.running); err != nil && !errors.Is(err, warehouse.ErrMidTransaction) {
			p.log.Debug("the copy in flight was not published", "err", err)
		}
	}
}

// final publishes the warehouse as the run leaves it (rows written
// between batches included: the run's own record, checks, interval
// refreshes): when no pipeline runs, warehouse.path is all of it. A run
// stopped inside a transaction it applied in parts (Ctrl-C) leaves the
// copy readers have, which held whole transactions: the next run
// completes the transaction, and publishes.
func (p *publisher) final(ctx context.Context) error {
	p.wait()
	if !p.wh.Consistent() {
		leftAsItWas(p.log)
		return nil
	}
	stage.Enter(stage.Publish)
	c, err := p.wh.Capture(context.WithoutCancel(ctx), p.path, false)
	if err != nil {
		return err
	}
	err = p.publish(context.WithoutCancel(ctx), c)
	p.counted(c.Gold)
	return err
}
