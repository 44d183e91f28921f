// Package config loads lakeflow.toml: strict decoding, defaults, then
// LAKEFLOW_<SECTION>_<KEY> environment overrides, then one validation pass
// that reports every problem with the key to fix. The file struct (what the
// user writes) is kept apart from Config (what the program uses).
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/fault"
)

// Config is the validated, typed configuration every stage is built from.
// Paths are absolute.
type Config struct {
	// File is the config file that was read, or "" when built-in defaults
	// were used because the default file does not exist.
	File        string
	DataDir     string
	Source      Source
	Kafka       Kafka
	Lake        Lake
	Warehouse   Warehouse
	Pipeline    Pipeline
	Contracts   Contracts
	Catalog     Catalog
	Check       Check
	Gold        Gold
	Bookkeeping Bookkeeping
}

// Bookkeeping says how long lakeflow's bookkeeping tables keep a row
// (0: for ever). lakeflow.batches' older rows are summarized per hour in
// lakeflow.batch_hours; the newest consistent batch and those after it
// are always kept.
type Bookkeeping struct {
	Batches, Runs, Checks time.Duration
}

// Gold locates the gold marts and says when each is refreshed.
type Gold struct {
	// Dir holds the marts' SQL files. When it does not exist and was not
	// set, the demo's marts built into lakeflow are used (DirSet false).
	Dir    string
	DirSet bool
	// Refresh is each mart's cadence, by name; a mart not listed is
	// refreshed with every batch.
	Refresh map[string]Refresh
}

// Refresh is a mart's cadence: with every batch (the zero value), at most
// once per Every (the partitions batches touch wait until then), or only
// when lakeflow backfill asks (Manual).
type Refresh struct {
	Every  time.Duration
	Manual bool
}

// Contracts locates the data contracts (one TOML file per table).
type Contracts struct {
	Dir string
}

// Catalog locates the dataset catalog (one TOML file per dataset).
type Catalog struct {
	Dir string
}

// Check says how often lakeflow run --follow runs lakeflow check's data
// part and records the results in lakeflow.checks (0: never).
type Check struct {
	Interval time.Duration
}

// Source describes the PostgreSQL database lakeflow captures.
type Source struct {
	// DSN is empty when lakeflow runs its own PostgreSQL under DataDir/pg.
	DSN         string
	Tables      []Table
	Slot        string
	Publication string
	// Heartbeat is how often lakeflow writes a logical message into the WAL
	// so the slot keeps advancing while the captured tables are idle.
	Heartbeat time.Duration
	Embedded  EmbeddedPostgres
}

// EmbeddedPostgres is the private cluster used when Source.DSN is empty.
type EmbeddedPostgres struct {
	Dir      string
	Port     int
	Database string
}

// Kafka configures the broker connection, or the embedded broker when
// Brokers is empty.
type Kafka struct {
	Brokers        []string
	Listen         string // embedded broker address
	Dir            string // embedded broker data
	TopicPrefix    string
	Partitions     int
	Retention      time.Duration
	RetentionBytes int64
}

// Embedded reports whether lakeflow runs its own broker.
func (k Kafka) Embedded() bool { return len(k.Brokers) == 0 }

// Lake is the bronze Parquet lake.
type Lake struct {
	Dir string
	// CompactTarget is the size lakeflow compact grows a merged file to;
	// CompactGrace how long the files it replaced stay for readers that
	// listed them before; CompactInterval how often lakeflow run --follow
	// compacts the days so far (0: never).
	CompactTarget   int64
	CompactGrace    time.Duration
	CompactInterval time.Duration
	// CheckpointInterval is how often lakeflow run --follow writes a
	// state checkpoint into the lake (0: never; lakeflow compact writes
	// one too).
	CheckpointInterval time.Duration
}

// Warehouse is the DuckDB file.
type Warehouse struct {
	// Path is the warehouse users open: while a pipeline runs, a
	// transaction-consistent copy of Live it publishes every
	// PublishInterval (replaced atomically); when none runs, all of it.
	Path string
	// Live is the warehouse lakeflow writes, private to the process that
	// holds data_dir (DuckDB lets no other process open a file one writes).
	Live string
	// PublishInterval is how often a running pipeline publishes Path (at
	// least four times as long as publishing takes, so it never costs more
	// than a fifth of the pipeline's time).
	PublishInterval time.Duration
	// MemoryLimit caps DuckDB's memory; it spills beyond it. 0 leaves it
	// to the command (run: 512 MiB; others: 1 GiB).
	MemoryLimit int64
	// Threads are DuckDB's worker threads. 0 leaves them to the command
	// (run: one fewer than the CPUs, at least one; others: one per CPU).
	Threads int
}

// Pipeline holds the batching limits; a batch closes at whichever limit is
// reached first.
type Pipeline struct {
	BatchEvents   int
	BatchBytes    int64
	BatchInterval time.Duration
}

// DefaultFile is the config file read when --config is not given.
const DefaultFile = "lakeflow.toml"

// Load reads path (strictly), applies defaults and the environment, and
// validates the result. When path is DefaultFile and the file does not
// exist, the built-in defaults are used: lakeflow runs out of the box.
func Load(path string, environ []string) (*Config, error) {
	f := defaults()
	base, err := os.Getwd()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", fault.ErrConfig, err)
	}
	used := ""
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := DecodeStrict(path, data, &f); err != nil {
			return nil, fmt.Errorf("%w: %v", fault.ErrConfig, err)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", fault.ErrConfig, err)
		}
		used, base = abs, filepath.Dir(abs)
	case errors.Is(err, os.ErrNotExist) && path == DefaultFile:
		// Built-in defaults, relative to the working directory.
	default:
		return nil, fmt.Errorf("%w: read config: %v", fault.ErrConfig, err)
	}
	fromEnv, err := applyEnv(&f, environ)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", fault.ErrConfig, err)
	}
	cfg, problems := f.resolve(base)
	for i, p := range problems {
		key, _, _ := strings.Cut(p, ":")
		if name, ok := fromEnv[key]; ok {
			problems[i] += " (set by " + name + ")"
		}
	}
	if len(problems) > 0 {
		where := "built-in defaults"
		if used != "" {
			where = used
		}
		return nil, fmt.Errorf("%w (%s): %s", fault.ErrConfig, where, strings.Join(problems, "; "))
	}
	cfg.File = used
	return cfg, nil
}
