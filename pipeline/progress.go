package pipeline

import (
	"fmt"
	"io"
	"time"

	"github.com/lakeflow/lakeflow/pipeline/postgres"
)

// showProgress redraws one status line every second until stop is called.
func showProgress(w io.Writer, src *postgres.Source, c *consumer) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		start := time.Now()
		var lastIn, lastOut int64
		last := start
		for {
			select {
			case <-done:
				fmt.Fprint(w, "\r\033[K")
				return
			case now := <-t.C:
				if p := src.Stats.Snapshot.Load(); p != nil {
					fmt.Fprint(w, "\r\033[K"+snapshotLine(p, now))
					continue
				}
				in, out := src.Stats.Events.Load(), c.stats.events.Load()
				secs := now.Sub(last).Seconds()
				lag := ""
				if wal, recv := src.Stats.ServerWAL.Load(), src.Stats.Received.Load(); wal > recv {
					lag = fmt.Sprintf(" | WAL behind %s", bytesHuman(wal-recv))
				}
				held := ""
				if q, d := c.stats.quarantined.Load(), c.stats.dead.Load(); q+d > 0 {
					held = fmt.Sprintf("  quarantined %d  DEAD LETTERS %d", q, d)
				}
				copying := ""
				if p := src.Stats.Copy.Load(); p != nil {
					copying = "  " + copyLine(p)
				}
				fmt.Fprintf(w, "\r\033[K%s  captured %d (%.0f/s)  applied %d (%.0f/s)  pending %d  batches %d  lake files %d%s%s%s",
					now.Sub(start).Round(time.Second), in, float64(in-lastIn)/secs, out, float64(out-lastOut)/secs,
					max(in-out, 0), c.stats.batches.Load(), c.stats.files.Load(), held, copying, lag)
				lastIn, lastOut, last = in, out, now
			}
		}
	}()
	return func() { close(done); <-finished }
}

// copyLine shows the progress of a copy while the stream runs.
func copyLine(p *postgres.CopyProgress) string {
	line := fmt.Sprintf("copying %s: %d rows", p.Table, p.Rows.Load())
	if p.Left > 0 {
		line += fmt.Sprintf(" (%d more tables to copy)", p.Left)
	}
	return line
}

// snapshotLine shows the initial snapshot's progress in one table: rows
// copied, of how many pg_class estimates, and the time left at this pace.
func snapshotLine(p *postgres.SnapshotProgress, now time.Time) string {
	done := p.Rows.Load()
	line := fmt.Sprintf("snapshot %s (table %d of %d): %d rows", p.Table, p.Index, p.Count, done)
	if p.Estimate > 0 {
		line += fmt.Sprintf(" of ~%d (%.0f%%)", p.Estimate, 100*float64(min(done, p.Estimate))/float64(p.Estimate))
		if elapsed := now.Sub(p.Started); done > 0 && done < p.Estimate {
			left := time.Duration(float64(elapsed) * float64(p.Estimate-done) / float64(done))
			line += fmt.Sprintf(", about %s left", left.Round(time.Second))
		}
	}
	return line
}

func bytesHuman(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
