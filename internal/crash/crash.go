// Package crash names the points where a test build of lakeflow (built
// with -tags faults) dies as kill -9 does, when LF_CRASH_AT names the
// point: the crash loop kills the pipeline at each one in turn and
// proves that nothing is lost or written twice. A release build compiles
// Point to nothing.
package crash

// The points, in the order a change meets them.
const (
	// SourceAcked: Kafka acknowledged events, before the slot is
	// confirmed past them.
	SourceAcked = "source.acked"
	// Watermark: a watermark was produced.
	Watermark = "producer.watermark"
	// Snapshot: the initial snapshot copied its first table.
	Snapshot = "snapshot.table"
	// Staged: a batch's lake files are written under their staging
	// names, before its transaction commits.
	Staged = "batch.staged"
	// Rules, History, Merge and Gold: inside a batch's transaction, after
	// each of its steps.
	Rules   = "batch.rules"
	History = "batch.history"
	Merge   = "batch.merge"
	Gold    = "batch.gold"
	// Committed: a batch committed, before its lake files' renames.
	Committed = "batch.committed"
	// Publishing: a copy of the warehouse is written, before its rename.
	Publishing = "publish.copy"
	// Swap: lakeflow backfill --all has rebuilt the warehouse, before the
	// rename that swaps it in.
	Swap = "backfill.swap"
	// CompactRecorded: lakeflow compact recorded a day's merged files,
	// before the rename that puts them in the lake; CompactSwapped:
	// after it, before the compaction is recorded as done.
	CompactRecorded = "compact.recorded"
	CompactSwapped  = "compact.swapped"
	// CheckpointBuilt: a state checkpoint of the lake is built, before
	// the rename that puts it in the lake.
	CheckpointBuilt = "checkpoint.built"
)

// Points are every point the crash loop covers.
var Points = []string{SourceAcked, Watermark, Snapshot, Staged, Rules, History, Merge, Gold, Committed, Publishing, Swap, CompactRecorded, CompactSwapped, CheckpointBuilt}

// Env names the point to die at, as point or point@n (the n-th time it is
// reached; the first by default). (Not LAKEFLOW_…: those are config
// keys, and an unknown one is refused.) HoldEnv names, the same way, a
// point to hold at for Hold instead, saying so on stderr: a test then
// acts (a SIGINT, say) while the process is there.
const (
	Env     = "LF_CRASH_AT"
	HoldEnv = "LF_HOLD_AT"
)
