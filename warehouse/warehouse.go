// Package warehouse is the DuckDB side: silver tables created from source
// schemas, the per-batch apply (staged and decoded first, then lake
// files, the guarded merge, soft deletes, offsets in one transaction), and the
// operations tables.
package warehouse

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	_ "github.com/duckdb/duckdb-go/v2" // the DuckDB database/sql driver

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// Warehouse is an open warehouse file. Its methods are not safe for
// concurrent use: one consumer owns it.
type Warehouse struct {
	// live: this is the pipeline's live warehouse (warehouse.live_path),
	// which alone finishes the lake's compactions.
	live bool
	path string
	db   *sql.DB
	conn *sql.Conn // a batch's TEMP tables live on this one connection
	lake *lake.Lake
	log  *slog.Logger
	// spill is where an in-memory warehouse (an asof answer) spills past
	// its memory limit; Close removes it.
	spill   string
	tables  map[string]*table // by source table ID
	byTopic map[string]*table
	// lakeHigh is, per topic and partition, the highest offset already in
	// a lake file of the era read (ReadingTopic); replayed events at or
	// below it are not written again.
	lakeHigh map[string]map[int32]int64
	// floor is the source position of the last consistent batch: every
	// event at or before it is in the lake and in silver.
	floor change.LSN
	// batch is the number of the last committed batch; published, the
	// last one a published copy holds (-1: none yet), set by Copy.Publish,
	// which runs beside the stream.
	batch     int64
	published atomic.Int64
	// midTransaction says the last batch did not end at a watermark: the
	// next may hold the rest of a source transaction.
	midTransaction bool
	// open is the position of the transaction the last batch applied in
	// part (Batch.Open), 0 if none.
	open change.LSN
	// known are tables whose lake holds events after floor from another
	// era of their Kafka log (ReadingTopic): those events are in
	// lakeflow_known and are not applied or written again.
	known     map[*table]bool
	contracts contracts.Set
	marts     []*mart
	// refreshing are the marts the batch being applied refreshes.
	refreshing []*mart
	// deferGold: batches leave the marts refreshed with every batch to
	// the next copy (DeferGold).
	deferGold bool
	// view, if set, says the warehouse only reads the lake (OpenView);
	// listing is its one listing of the lake's files, by table directory,
	// whole batches up to complete.
	view     *View
	listing  map[string][]lake.Part
	complete change.LSN
	// releaseLake lets go of the files the view listed (lake.HoldFiles).
	releaseLake func()
	// stager is the connection Stage appends on, laker the one a batch's
	// lake files are written on; each is opened by its first batch.
	stager, laker *sql.Conn
	// beforeCommit, if set, runs just before a batch commits (tests).
	beforeCommit func()
	// olderVersions says ApplyVersions is applying versions older than
	// the newest, against which contract rules are not checked.
	olderVersions bool
}

// table is a silver table and the SQL that decodes its staged events.
type table struct {
	id     int
	topic  string
	schema *change.Table
	parse  string
	// flat, if set, decodes the envelopes it can in Go (flatDecoder).
	flat *flatDecoder
	// rules are the contract's rules for the table.
	rules []rule
	// pending are the renames the contract accepts that silver has not
	// taken yet: the rules read the old columns under the new names.
	pending contracts.Renames
	// history says the contract asks for SCD2 history.
	history bool
}

const bootstrap = `
CREATE SCHEMA IF NOT EXISTS silver;
CREATE SCHEMA IF NOT EXISTS lakeflow;
CREATE TABLE IF NOT EXISTS lakeflow.tables (
	source_table VARCHAR PRIMARY KEY,
	topic        VARCHAR NOT NULL,
	silver_table VARCHAR NOT NULL,
	schema       JSON NOT NULL,
	updated_at   TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS lakeflow.offsets (
	topic       VARCHAR NOT NULL,
	"partition" INTEGER NOT NULL,
	next_offset BIGINT NOT NULL,
	topic_id    VARCHAR,
	updated_at  TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (topic, "partition")
);
ALTER TABLE lakeflow.offsets ADD COLUMN IF NOT EXISTS topic_id VARCHAR;
ALTER TABLE lakeflow.offsets ADD COLUMN IF NOT EXISTS bound BIGINT;
CREATE TABLE IF NOT EXISTS lakeflow.lake_files (
	path         VARCHAR PRIMARY KEY,
	source_table VARCHAR NOT NULL,
	day          DATE NOT NULL,
	topic        VARCHAR NOT NULL,
	"partition"  INTEGER NOT NULL,
	first_offset BIGINT NOT NULL,
	last_offset  BIGINT NOT NULL,
	events       BIGINT NOT NULL,
	min_seq      UBIGINT NOT NULL,
	max_seq      UBIGINT NOT NULL,
	bytes        BIGINT NOT NULL,
	committed_at TIMESTAMPTZ NOT NULL,
	topic_id     VARCHAR,
	batch        BIGINT
);
CREATE TABLE IF NOT EXISTS lakeflow.batches (
	batch        BIGINT PRIMARY KEY,
	consistent   BOOLEAN NOT NULL,
	lsn          UBIGINT,
	end_lsn      UBIGINT,
	commit_ts    TIMESTAMPTZ,
	events       BIGINT NOT NULL,
	committed_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS lakeflow.compactions (
	id           VARCHAR PRIMARY KEY,
	source_table VARCHAR NOT NULL,
	day          DATE NOT NULL,
	files        VARCHAR[] NOT NULL,
	replaced     BIGINT NOT NULL,
	recorded_at  TIMESTAMPTZ NOT NULL,
	swapped_at   TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS lakeflow.batch_hours (
	hour           TIMESTAMPTZ PRIMARY KEY,
	batches        BIGINT NOT NULL,
	consistent     BIGINT NOT NULL,
	events         BIGINT NOT NULL,
	first_batch    BIGINT NOT NULL,
	last_batch     BIGINT NOT NULL,
	freshness_mean DOUBLE,
	freshness_max  DOUBLE
);
CREATE TABLE IF NOT EXISTS lakeflow.schema_history (
	source_table VARCHAR NOT NULL,
	since_seq    UBIGINT NOT NULL,
	since_ord    UINTEGER NOT NULL,
	schema       JSON NOT NULL,
	change       VARCHAR NOT NULL,
	recorded_at  TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (source_table, since_seq, since_ord)
);
CREATE TABLE IF NOT EXISTS lakeflow.checks (
	checked_at TIMESTAMPTZ NOT NULL,
	part       VARCHAR NOT NULL,
	"check"    VARCHAR NOT NULL,
	severity   VARCHAR NOT NULL,
	dataset    VARCHAR,
	count      BIGINT NOT NULL,
	examples   VARCHAR[],
	message    VARCHAR
);
CREATE TABLE IF NOT EXISTS lakeflow.runs (
	started_at    TIMESTAMPTZ NOT NULL,
	ended_at      TIMESTAMPTZ NOT NULL,
	follow        BOOLEAN NOT NULL,
	events        BIGINT NOT NULL,
	batches       BIGINT NOT NULL,
	lake_files    BIGINT NOT NULL,
	quarantined   BIGINT NOT NULL,
	dead_lettered BIGINT NOT NULL,
	seconds       STRUCT(stage DOUBLE, decode DOUBLE, lake DOUBLE, rules DOUBLE, history DOUBLE, merge DOUBLE, gold DOUBLE, "commit" DOUBLE),
	exit_reason   VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS lakeflow.source_state (
	id         INTEGER PRIMARY KEY,
	state      JSON NOT NULL,
	updated_at TIMESTAMPTZ NOT NULL
);
`

// Open opens (creating if needed) the warehouse at cfg.Path, finishes any
// lake publication a crash interrupted, and loads the table registry.
func Open(ctx context.Context, cfg config.Warehouse, lk *lake.Lake, log *slog.Logger) (*Warehouse, error) {
	return open(ctx, cfg, lk, log, nil)
}

// View says how a warehouse that only reads the lake (lakeflow asof) is
// built: it leaves the lake's staging alone (a running pipeline owns it),
// and keeps history only if asked.
type View struct {
	History bool
}

// OpenView creates a warehouse at path ("": in memory) that reads the
// lake and never writes it.
func OpenView(ctx context.Context, path string, cfg config.Warehouse, lk *lake.Lake, log *slog.Logger, v View) (*Warehouse, error) {
	return open(ctx, config.Warehouse{Path: path, MemoryLimit: cfg.MemoryLimit, Threads: cfg.Threads}, lk, log, &v)
}

// ForSilver makes a view build silver alone: no history, from the tables
// registered next on. (The quarantine is still recorded: an update that
// left a TOASTed value unchanged may take it from a change held back.)
func (w *Warehouse) ForSilver() {
	if w.view != nil {
		w.view.History = false
	}
}

func open(ctx context.Context, cfg config.Warehouse, lk *lake.Lake, log *slog.Logger, view *View) (*Warehouse, error) {
	path := cfg.Path
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("%w: create %s: %v", fault.ErrEnvironment, filepath.Dir(path), err)
	}
	db, conn, err := connect(ctx, path, path)
	if err != nil {
		return nil, err
	}
	w := &Warehouse{path: path, db: db, conn: conn, lake: lk, log: log, view: view, live: cfg.Live != "" && cfg.Path == cfg.Live,
		tables: map[string]*table{}, byTopic: map[string]*table{},
		lakeHigh: map[string]map[int32]int64{}, known: map[*table]bool{}}
	w.published.Store(-1)
	if path == "" {
		// DuckDB spills an in-memory database into .tmp under the working
		// directory: the user's, wherever they ran lakeflow.
		if w.spill, err = os.MkdirTemp("", "lakeflow-spill-"); err == nil {
			_, err = conn.ExecContext(ctx, "SET temp_directory = "+literal(w.spill))
		}
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("%w: a directory for DuckDB to spill into: %v", fault.ErrEnvironment, err)
		}
	}
	if err := w.init(ctx, cfg.MemoryLimit, cfg.Threads); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// connect opens DuckDB at dsn (path with options) and one connection,
// the one temp tables live on.
func connect(ctx context.Context, path, dsn string) (*sql.DB, *sql.Conn, error) {
	db, err := sql.Open("duckdb", dsn)
	if err != nil {
		return nil, nil, openError(path, err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, nil, openError(path, err)
	}
	return db, conn, nil
}

// ErrHeld is the error of a warehouse another process has open.
var ErrHeld = errors.New("the warehouse is open in another process")

func openError(path string, err error) error {
	if strings.Contains(err.Error(), "Could not set lock") {
		return fmt.Errorf("%w: %w: %s (DuckDB allows one writer): close it, or run lakeflow with another warehouse.path: %v",
			fault.ErrEnvironment, ErrHeld, path, err)
	}
	return fmt.Errorf("%w: open warehouse %s: %v", fault.ErrEnvironment, path, err)
}

// recoverStaging publishes the staged lake files of batches the warehouse
// committed and removes the others. Only a warehouse that has committed
// batches can tell one from the other: a new one (a rebuild's or a
// shadow's, opened on the lake beside the live warehouse) leaves the
// staging area alone, or it would remove the files of a batch the live
// warehouse committed and could not publish.
func (w *Warehouse) recoverStaging(ctx context.Context) error {
	var batches int
	if err := w.conn.QueryRowContext(ctx, "SELECT count(*) FROM lakeflow.batches").Scan(&batches); err != nil || batches == 0 {
		return err
	}
	published, removed, err := w.lake.Recover(func(path string) (bool, error) { return w.recorded(ctx, path) })
	if err != nil {
		return fmt.Errorf("recover lake staging: %w", err)
	}
	if published+removed > 0 {
		w.log.Info("lake staging recovered", "published", published, "removed", removed)
	}
	return nil
}

// recorded says whether lakeflow.lake_files records the lake file at path
// (relative to the lake): a committed batch's.
func (w *Warehouse) recorded(ctx context.Context, path string) (bool, error) {
	var n int
	err := w.conn.QueryRowContext(ctx, "SELECT count(*) FROM lakeflow.lake_files WHERE path = ?", path).Scan(&n)
	return n > 0, err
}

// defaultMemoryLimit caps DuckDB's memory when the configuration leaves
// it to the command.
const defaultMemoryLimit = 1 << 30

// session is what a connection that runs a batch's SQL or a mart's needs
// set: DuckDB keeps these for each connection.
var session = []string{
	"SET TimeZone = 'UTC'",
	// Reference rules ASOF-join a batch's changes with those of the
	// table they reference; the nested-loop plan DuckDB picks from its
	// row estimates costs tens of ms per batch, the sort plan a few.
	"SET asof_loop_join_threshold = 0",
	intervalMacro,
	utcDateMacro,
}

func (w *Warehouse) init(ctx context.Context, memoryLimit int64, threads int) error {
	// Without a limit DuckDB may take 80% of the machine's memory.
	if memoryLimit == 0 {
		memoryLimit = defaultMemoryLimit
	}
	for _, stmt := range slices.Concat(session, []string{
		// Every query whose order matters says ORDER BY (lake files are
		// written in offset order); the others may run in any order,
		// which lets DuckDB fill tables in parallel.
		"SET preserve_insertion_order = false",
		// Lake files never change once written: a replay reads each one's
		// footer once.
		"SET parquet_metadata_cache = true",
		// DuckDB checkpoints (writes the row groups batches changed into
		// the file) once its log passes this size: at the default, 16 MiB,
		// every second or third backlog batch, rewriting a row group as
		// often as batches change it. At 64 MiB commits cost half as much
		// (backlog run: 0.86-0.94 s -> 0.45 s, 51-52K -> 56-59K events/s);
		// opening after a crash replays at most that much log.
		"SET checkpoint_threshold = '64MiB'",
		fmt.Sprintf("SET memory_limit = '%dMB'", max(memoryLimit>>20, 64)),
		bootstrap,
		deadLetterTables,
		quarantineTable,
		deferredTable,
		goldTables,
		"CREATE OR REPLACE TEMP TABLE lakeflow_known (tbl INTEGER, seq UBIGINT, ord UINTEGER)",
	}) {
		if _, err := w.conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("initialise warehouse %s: %w", w.path, err)
		}
	}
	if threads > 0 { // else DuckDB's default, one per CPU
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("SET threads = %d", threads)); err != nil {
			return fmt.Errorf("initialise warehouse %s: %w", w.path, err)
		}
	}
	if _, err := w.conn.ExecContext(ctx, "ATTACH IF NOT EXISTS ':memory:' AS "+scratchDB); err != nil {
		return fmt.Errorf("initialise warehouse %s: %w", w.path, err)
	}
	if _, err := w.conn.ExecContext(ctx, createStage); err != nil {
		return fmt.Errorf("initialise warehouse %s: %w", w.path, err)
	}
	if err := w.resetScratch(ctx, "lakeflow_dead", "lakeflow_failures"); err != nil {
		return fmt.Errorf("initialise warehouse %s: %w", w.path, err)
	}
	if w.view != nil {
		return nil
	}
	if err := w.recoverStaging(ctx); err != nil {
		return err
	}
	rows, err := w.conn.QueryContext(ctx, "SELECT topic, schema::VARCHAR FROM lakeflow.tables ORDER BY source_table")
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var topic, schema string
		if err := rows.Scan(&topic, &schema); err != nil {
			return err
		}
		var t change.Table
		if err := json.Unmarshal([]byte(schema), &t); err != nil {
			return fmt.Errorf("lakeflow.tables: schema of %s: %w", topic, err)
		}
		w.register(topic, &t)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var floor sql.NullInt64
	if err := w.conn.QueryRowContext(ctx, `SELECT (max(lsn) FILTER (consistent))::BIGINT, coalesce(max(batch), 0), coalesce(NOT arg_max(consistent, batch), false)
		FROM lakeflow.batches`).Scan(&floor, &w.batch, &w.midTransaction); err != nil {
		return err
	}
	w.floor = change.LSN(floor.Int64)
	if w.midTransaction {
		// The transaction the last batches applied in part: where the
		// records they took end.
		var open sql.NullInt64
		if err := w.conn.QueryRowContext(ctx, `SELECT max(max_seq)::BIGINT FROM lakeflow.lake_files
			WHERE batch > (SELECT coalesce(max(batch) FILTER (consistent), 0) FROM lakeflow.batches)`).Scan(&open); err != nil {
			return err
		}
		w.open = change.LSN(open.Int64)
	}
	if !w.live {
		// A rebuild's or a shadow's warehouse: the compactions under way
		// are the live one's.
		return nil
	}
	return w.recoverCompactions(ctx)
}

// lakeDir is the directory of a table in the lake (change.SafeName).
func lakeDir(t *change.Table) string { return change.SafeName(t.Name) }

func (w *Warehouse) raiseLakeHigh(topic string, part int32, off int64) {
	if w.lakeHigh[topic] == nil {
		w.lakeHigh[topic] = map[int32]int64{}
	}
	if cur, ok := w.lakeHigh[topic][part]; !ok || off > cur {
		w.lakeHigh[topic][part] = off
	}
}

// openSide opens one of the warehouse's side connections (stager, laker)
// if it is not open yet.
func (w *Warehouse) openSide(ctx context.Context, conn **sql.Conn) error {
	if *conn != nil {
		return nil
	}
	c, err := w.db.Conn(ctx)
	if err != nil {
		return err
	}
	*conn = c
	return nil
}

// Close closes the warehouse; DuckDB checkpoints on a clean close.
func (w *Warehouse) Close() error {
	err := w.conn.Close()
	for _, c := range []*sql.Conn{w.stager, w.laker} {
		if c != nil {
			err = errors.Join(err, c.Close())
		}
	}
	err = errors.Join(err, w.db.Close())
	if w.releaseLake != nil {
		w.releaseLake()
	}
	if w.spill != "" {
		err = errors.Join(err, os.RemoveAll(w.spill))
	}
	return err
}

// Memory is what DuckDB's buffer manager holds (duckdb_memory(): the
// warehouse's blocks, a batch's working set) and what it spilled to
// temporary files. It uses a connection of its own, so it may run beside
// Apply.
func (w *Warehouse) Memory(ctx context.Context) (inMemory, spilled int64, err error) {
	err = w.db.QueryRowContext(ctx, "SELECT coalesce(sum(memory_usage_bytes), 0)::BIGINT, coalesce(sum(temporary_storage_bytes), 0)::BIGINT FROM duckdb_memory()").
		Scan(&inMemory, &spilled)
	return inMemory, spilled, err
}

// Path is the warehouse file.
func (w *Warehouse) Path() string { return w.path }

// Topic is the topic of the table with ID id ("" if none).
func (w *Warehouse) Topic(id string) string {
	if t := w.tables[id]; t != nil {
		return t.topic
	}
	return ""
}

// Topics lists the topics of the registered tables.
func (w *Warehouse) Topics() []string {
	out := make([]string, 0, len(w.byTopic))
	for topic := range w.byTopic {
		out = append(out, topic)
	}
	return out
}

// Floor is the source position silver was at after the last consistent
// batch: every event at or before it is applied.
func (w *Warehouse) Floor() change.LSN { return w.floor }

// TopicPosition is where the warehouse stands in a topic: the topic's ID
// when it was read, and the next offset of each partition.
type TopicPosition struct {
	ID   string
	Next map[int32]int64
}

// Offsets returns where the warehouse stands in topic.
func (w *Warehouse) Offsets(ctx context.Context, topic string) (TopicPosition, error) {
	pos := TopicPosition{Next: map[int32]int64{}}
	rows, err := w.conn.QueryContext(ctx, `SELECT "partition", next_offset, coalesce(topic_id, '') FROM lakeflow.offsets WHERE topic = ?`, topic)
	if err != nil {
		return pos, err
	}
	defer rows.Close()
	for rows.Next() {
		var p int32
		var off int64
		if err := rows.Scan(&p, &off, &pos.ID); err != nil {
			return pos, err
		}
		pos.Next[p] = off
	}
	return pos, rows.Err()
}

// offsetRows renders positions, and the bounds that go with them, as
// lakeflow.offsets rows.
func offsetRows(positions map[string]TopicPosition, bounds map[string]map[int32]int64) []string {
	var rows []string
	for topic, pos := range positions {
		for p, off := range pos.Next {
			bound := "NULL"
			if b, ok := bounds[topic][p]; ok {
				bound = itoa(b)
			}
			rows = append(rows, fmt.Sprintf("(%s, %d, %d, %s, now(), %s)", literal(topic), p, off, literal(pos.ID), bound))
		}
	}
	return rows
}

// saveOffsets records positions; it runs inside the caller's transaction.
func (w *Warehouse) saveOffsets(ctx context.Context, positions map[string]TopicPosition) error {
	return w.saveOffsetsBounded(ctx, positions, nil)
}

// saveOffsetsBounded records positions and, where bounds has one, the
// watermark bound of a partition (a partition's bound is kept when it has
// none); it runs inside the caller's transaction.
func (w *Warehouse) saveOffsetsBounded(ctx context.Context, positions map[string]TopicPosition, bounds map[string]map[int32]int64) error {
	rows := offsetRows(positions, bounds)
	if len(rows) == 0 {
		return nil
	}
	_, err := w.conn.ExecContext(ctx, `INSERT INTO lakeflow.offsets (topic, "partition", next_offset, topic_id, updated_at, bound) VALUES `+strings.Join(rows, ", ")+`
		ON CONFLICT DO UPDATE SET next_offset = excluded.next_offset, topic_id = excluded.topic_id, updated_at = excluded.updated_at,
			bound = coalesce(excluded.bound, lakeflow.offsets.bound)`)
	return err
}

// Bounds returns, per partition of topic, the watermark bound the last
// batch that ended at a mark recorded: in a partition, records below it
// and after its position may wait for a later batch (the consumer
// restarts its bounds from there).
func (w *Warehouse) Bounds(ctx context.Context, topic string) (map[int32]int64, error) {
	rows, err := w.conn.QueryContext(ctx, `SELECT "partition", bound FROM lakeflow.offsets WHERE topic = ? AND bound IS NOT NULL`, topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var b int64
		if err := rows.Scan(&p, &b); err != nil {
			return nil, err
		}
		out[p] = b
	}
	return out, rows.Err()
}

// scratch are the TEMP tables every batch fills, emptied at its commit.
var scratch = map[string]string{
	"lakeflow_dead":     `topic VARCHAR, "partition" INTEGER, "offset" BIGINT, source_table VARCHAR, failure_stage VARCHAR, failure_reason VARCHAR, payload BLOB, _cdc_seq UBIGINT, _cdc_ord UINTEGER`,
	"lakeflow_failures": "tbl INTEGER, kafka_partition INTEGER, kafka_offset BIGINT, rule VARCHAR, action VARCHAR",
}

// releaseScratch frees the TEMP tables a committed batch leaves behind:
// the rows of one image a change and the merge's intermediates
// take as much memory as the batch itself, and kept until the next batch
// replaces them they would double DuckDB's peak (lakeflow_known and a
// backfill's slice keys are the session's, not the batch's). It runs after a commit, so a cancel
// (Ctrl-C) does not stop it: the batch is done either way. The pages
// DuckDB's allocator holds freed are not purged here: the next batch of a
// backlog faults them in again (a replay of 1.4M events: 59 s and 65 s of
// CPU without the purge against 72 s and 80 s with it, alternated, peak
// RSS within the spread); jemalloc returns them once they have been idle
// for its decay time.
func (w *Warehouse) releaseScratch(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	rows, err := w.conn.QueryContext(ctx, "SELECT table_name FROM duckdb_tables() WHERE temporary AND table_name <> 'lakeflow_known' AND NOT starts_with(table_name, 'lakeflow_slice_')")
	if err != nil {
		return err
	}
	var reset, drops []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		if _, ok := scratch[name]; ok {
			reset = append(reset, name)
		} else {
			drops = append(drops, "DROP TABLE temp.main."+ident(name))
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	return errors.Join(w.resetScratch(ctx, reset...), w.exec(ctx, drops))
}

// resetScratch empties scratch tables by creating them again: DuckDB
// keeps the storage of rows deleted from a TEMP table, so DELETE would
// grow the process by every batch it ever staged.
func (w *Warehouse) resetScratch(ctx context.Context, names ...string) error {
	for _, n := range names {
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s (%s)", n, scratch[n])); err != nil {
			return err
		}
	}
	return nil
}
