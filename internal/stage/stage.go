// Package stage labels the goroutines of lakeflow run with the stage of
// the pipe they work for, so that a CPU profile (lakeflow run --profile)
// splits by stage: go tool pprof -tags, or -tagfocus stage=merge.
//
// Labels mark goroutines: a DuckDB statement counts under the stage that
// ran it for the thread that called it; DuckDB's own worker threads are
// sampled without a label (as the binary's and libc's code, no Go stack).
package stage

import (
	"context"
	"runtime/pprof"
)

// A Stage is a pipe stage's label set, made once: switching a
// goroutine's stage costs a pointer store, not an allocation, so it can
// happen per event.
type Stage struct{ ctx context.Context }

func named(name string) Stage {
	return Stage{pprof.WithLabels(context.Background(), pprof.Labels("stage", name))}
}

// The stages: the source's (WAL to Kafka), the broker's, and the
// consumer's (Kafka to lake and warehouse), whose batch phases are those
// of warehouse.BatchStats (parse: its decode, JSON envelopes to typed
// rows).
var (
	WALRead = named("wal_read")
	Decode  = named("decode")
	Encode  = named("encode")
	Produce = named("produce")
	Broker  = named("broker")
	Fetch   = named("fetch")
	Staging = named("stage")
	Parse   = named("parse")
	Lake    = named("lake_write")
	Rules   = named("rules")
	History = named("history")
	Merge   = named("merge")
	Gold    = named("gold")
	Commit  = named("commit")
	Publish = named("publish")
)

// Enter labels the calling goroutine (and the goroutines it starts from
// now on) with s.
func Enter(s Stage) { pprof.SetGoroutineLabels(s.ctx) }

// Within runs f labelled with s (and the goroutines it starts, for good),
// then takes the label off.
func Within(s Stage, f func()) {
	Enter(s)
	defer pprof.SetGoroutineLabels(context.Background())
	f()
}
