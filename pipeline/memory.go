package pipeline

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/lakeflow/lakeflow/pipeline/config"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
)

// limitGoHeap gives the Go heap of a run a soft limit, unless GOMEMLIMIT
// sets one: the records a batch may hold (batch_bytes), what the producer
// may buffer, and 64 MiB for the rest. Left to GOGC alone the heap grows
// to twice what is live between collections, and a backlog's live heap
// (fetched records, the batch) made that ~100 MiB of RSS held for nothing.
// A soft limit only makes collections more frequent near it; a heap that
// has to outgrow it (a huge transaction) still can. It returns what
// restores the limit before (tests run pipelines in one process).
func limitGoHeap(cfg *config.Config, log *slog.Logger) (restore func()) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	limit := cfg.Pipeline.BatchBytes + kafka.ProducerBufferBytes + 64<<20
	prev := debug.SetMemoryLimit(limit)
	log.Debug("go heap soft limit", "bytes", limit)
	return func() { debug.SetMemoryLimit(prev) }
}
