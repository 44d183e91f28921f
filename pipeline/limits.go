package pipeline

import (
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// runMemoryLimit caps DuckDB's memory in a run, unless
// warehouse.memory_limit says. A batch's working set is bounded (by
// batch_events and batch_bytes); what DuckDB holds beyond it is a cache of
// the warehouse's blocks, which grows with the warehouse up to the cap: a
// 5,000,000-change backlog replayed from Kafka peaked at 1,097-1,126 MiB
// of RSS with 1 GiB, 887-889 MiB with 512 MiB, in about the same time
// (105-162 s against 111-141 s, alternated); at 510,663 changes the cap is
// not reached. (Backfill and asof keep 1 GiB: they load the lake in large
// chunks, and a 5,000,000-change backfill --all took half as long again at
// 512 MiB.)
const runMemoryLimit = 512 << 20

// runThreads are DuckDB's worker threads in a run, unless
// warehouse.threads says: one fewer than the CPUs the process may use (a
// container's CPU quota counts, as it does for DuckDB's own default), at
// least one. The rest
// of the pipe (reading the WAL, Kafka, decoding envelopes) needs a core
// too, and DuckDB's threads contending for it cost more than their
// parallelism gained (2 CPUs, quick benches alternated, 2 threads against
// 1: live 18.3K and 20.8K events/s against 22.2K and 25.1K, CPU 32.9 and
// 29.5 s against 25.5 and 21.7 s; a replay from Kafka 29.4K and 27.8K
// against 25.5K and 32.2K). Backfill and asof, which run alone, keep one
// per CPU.
func runThreads() int { return max(runtime.GOMAXPROCS(0)-1, 1) }

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

// releaseBytes is the size of a batch's record values past which
// releasing them hands the Go heap's free memory back to the system.
// Forcing a collection costs a few milliseconds; a small batch (a
// follower's) frees too little to be worth it.
const releaseBytes = 8 << 20

// release drops a staged batch's record values (the warehouse has them)
// and, for a large batch, gives the memory back at once. The values point
// into the decompressed Kafka batches they came in (three quarters of the
// live Go heap in a backlog); held, those would stay live until the batch
// commits, and the heap would keep their pages for the next fetch, while
// DuckDB's working set for the batch is at its largest. Only the values
// of records no one else holds are freed: the consumer takes the batch
// off its pending records first.
func release(recs []warehouse.Record) {
	n := 0
	for i := range recs {
		n += len(recs[i].Value)
		recs[i].Value = nil
	}
	if n >= releaseBytes {
		debug.FreeOSMemory()
	}
}
