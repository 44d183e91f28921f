package warehouse

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/duckdb/duckdb-go/v2"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/internal/stage"
)

// Record is one consumed Kafka record.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Value     []byte
	// Arrived is when it reached Kafka: the consumer closes a batch by
	// the age of its oldest record.
	Arrived time.Time
	// Seq is its event's position (_cdc_seq), 0 if it carries none: the
	// consumer cuts batches by it.
	Seq change.LSN
}

// Batch is what one warehouse transaction applies.
type Batch struct {
	Records []Record
	// Positions are where the batch leaves every topic it read: the table
	// topics and the watermark topic.
	Positions map[string]TopicPosition
	// Watermark is set when the batch ends exactly at it: silver is then
	// the source as of Watermark.Seq, with no transaction in part.
	Watermark *change.Watermark
	// Open is the position of the transaction the batch applies in part
	// (a split mark's), 0 if none: its changes that fail an existence
	// rule are deferred to the batches after it (deferred.go).
	Open change.LSN
	// Dead are records the batch read that are not lakeflow's (another
	// client wrote them to its watermark or state topic): they become
	// dead letters with the batch's own.
	Dead []DeadLetter
	// Bounds are the watermark bounds of the mark the batch ends at that
	// changed since the last one recorded (Warehouse.Bounds); Positions
	// names each of their partitions.
	Bounds map[string]map[int32]int64
}

// BatchStats describes an applied batch and where its time went.
type BatchStats struct {
	Events    int
	LakeFiles int
	Tables    int
	// Dead are the events sent to the dead-letter queue.
	Dead []DeadLetter
	// Quarantined counts the changes held back by rules; Warned those
	// applied with a rule's warning.
	Quarantined, Warned int
	Stage               time.Duration // appending the envelopes
	Decode              time.Duration // JSON to typed rows, dead letters set aside
	Lake                time.Duration // writing and syncing lake files, beside rules to gold
	Rules               time.Duration // contract rules and quarantine
	History             time.Duration // SCD2 history
	Gold                time.Duration // gold marts: touched partitions, refreshes
	Merge               time.Duration // silver
	Commit              time.Duration // waiting for the lake files, bookkeeping, commit, renames, scratch freed
}

// laps returns a stopwatch: each call gives the time since the one
// before (since laps, the first time).
func laps() func() time.Duration {
	lap := time.Now()
	return func() time.Duration {
		now := time.Now()
		d := now.Sub(lap)
		lap = now
		return d
	}
}

// Add adds b's time per phase to st's.
func (st *BatchStats) Add(b BatchStats) {
	st.Stage += b.Stage
	st.Decode += b.Decode
	st.Lake += b.Lake
	st.Rules += b.Rules
	st.History += b.History
	st.Gold += b.Gold
	st.Merge += b.Merge
	st.Commit += b.Commit
}

// ApplyStaged applies a staged batch in one DuckDB transaction. Before
// it, the staged records are decoded into scratch tables and those that
// cannot be applied set aside (dead letters); then each table's new
// events are written to lake files under staging names, on a connection
// of their own, while the transaction records the dead letters, holds
// back the changes that break a contract rule (quarantine) and merges the
// rest into silver; it records the lake files once they are written, the
// positions and the batch. The lake files reach their final names only
// after the commit. A batch that fails leaves the warehouse as it was;
// applying it again is a no-op for what it already holds.
//
// It reads no record's Value (Stage has them) and runs to its end
// whatever becomes of ctx: its work is bounded by its size (batch_events,
// batch_bytes) and its transaction by txTimeout. Once s.Read is closed,
// the next batch may be staged beside the rest of this one.
func (w *Warehouse) ApplyStaged(ctx context.Context, b Batch, s *Staged) (BatchStats, error) {
	st := BatchStats{Stage: s.took}
	since := laps()
	ctx = context.WithoutCancel(ctx)
	order, rows, err := w.decodeBatch(ctx, b, s, &st, since)
	close(s.read)
	if err == nil {
		err = w.narrow(ctx, order, rows)
	}
	if err != nil {
		return st, fmt.Errorf("batch: %w", err)
	}
	st.Decode += since()
	lf := w.writeBatchLake(ctx, b, order)
	var dead []lake.File
	err = w.inTx(ctx, func(ctx context.Context) error {
		var err error
		dead, err = w.applyInTx(ctx, b, lf, order, rows, &st, since)
		return err
	})
	// The lake write ends before the batch does, whatever became of the
	// transaction: the next batch makes its decoded tables anew.
	written, lakeErr := lf.wait()
	st.Lake = lf.took
	files := dead
	for _, f := range written {
		files = append(files, f.File)
	}
	// A transaction that reached its commit waited for the lake write
	// and failed with it.
	if err == nil {
		err = lakeErr
	}
	if err != nil {
		w.removeStaging(ctx, files)
		if fault.DiskFull(err) {
			return st, fmt.Errorf("%w: batch: %w (nothing of the batch is kept: free space, then lakeflow run goes on from the last batch that committed)", fault.ErrEnvironment, err)
		}
		return st, fmt.Errorf("batch: %w", err)
	}
	// Committed: from here a crash is rolled forward by lake.Recover. The
	// warehouse's own state moves on before the files are published: if
	// that fails, the batch is applied (ErrUnpublished).
	crash.Point(crash.Committed)
	for _, r := range b.Records {
		w.raiseLakeHigh(r.Topic, r.Partition, r.Offset)
	}
	w.batch++
	w.midTransaction = b.Watermark == nil
	for _, m := range w.refreshing {
		m.refreshed = time.Now()
	}
	if b.Watermark != nil {
		w.floor = max(w.floor, b.Watermark.Seq)
	}
	st.Events, st.LakeFiles, st.Tables = len(b.Records), len(files), len(order)
	if err := w.lake.Publish(files); err != nil {
		return st, fmt.Errorf("%w: %w: %w (fix that and run lakeflow run again: it publishes them before anything else)",
			fault.ErrEnvironment, ErrUnpublished, err)
	}
	// The batch is done: scratch tables that could not be freed only
	// hold memory until the next batch replaces them.
	if err := w.releaseScratch(ctx); err != nil {
		w.log.Warn("free the batch's scratch tables", "err", err)
	}
	st.Commit = since()
	return st, nil
}

// ErrUnpublished says a batch committed but its lake files stayed under
// their staging names: the run must stop, not apply the batch again; the
// next start publishes them (lake.Recover).
var ErrUnpublished = errors.New("the batch committed, but its lake files could not be published")

// removeStaging removes the staging files of a batch that failed, except
// those lakeflow.lake_files records (a batch that committed them: they are
// lake.Recover's to publish) or that it cannot tell; lake.Recover removes
// what is left at the next start.
func (w *Warehouse) removeStaging(ctx context.Context, files []lake.File) {
	for _, f := range files {
		if recorded, err := w.recorded(context.WithoutCancel(ctx), f.Path); err == nil && !recorded {
			os.Remove(f.Staging)
		}
	}
}

// decodeBatch decodes each table's staged records into its decoded table,
// with the dead letters set aside, and returns the tables in order. It
// fills scratch tables alone, so it runs before the batch's transaction:
// the staged envelopes, as large as the batch, are freed once decoded
// instead of at the commit.
func (w *Warehouse) decodeBatch(ctx context.Context, b Batch, s *Staged, st *BatchStats, since func() time.Duration) ([]*table, map[*table]rowsInfo, error) {
	stage.Enter(stage.Parse)
	if err := w.resetScratch(ctx, "lakeflow_dead"); err != nil {
		return nil, nil, err
	}
	if err := w.addDead(ctx, b.Dead); err != nil {
		return nil, nil, err
	}
	touched := map[*table]bool{}
	for _, r := range b.Records {
		if t := w.byTopic[r.Topic]; t != nil {
			touched[t] = true
		}
	}
	order := make([]*table, 0, len(touched))
	for t := range touched {
		order = append(order, t)
	}
	slices.SortFunc(order, func(a, b *table) int { return a.id - b.id })
	rows := map[*table]rowsInfo{}
	for _, t := range order {
		info, err := w.decode(ctx, t, s.tables[t])
		if err != nil {
			return nil, nil, err
		}
		rows[t] = info
	}
	if err := w.schemaless(ctx); err != nil {
		return nil, nil, err
	}
	// Emptied (freed) now: the next batch is staged beside this one's
	// merge.
	if _, err := w.conn.ExecContext(ctx, createStage); err != nil {
		return nil, nil, err
	}
	st.Decode = since()
	return order, rows, nil
}

// narrow makes each table's rows table of its decoded events: the one
// image per change that the rest of the batch applies, in after (an
// update's or insert's after image, a delete's before image: the shape a
// replay loads), without the columns only the lake needs. Nothing applies
// an update's before image; without it and them the rows a batch holds
// through its merge take half the memory (a table replaced inside a
// transaction is freed only at its commit). The lake files are written
// from the decoded tables.
func (w *Warehouse) narrow(ctx context.Context, order []*table, rows map[*table]rowsInfo) error {
	for _, t := range order {
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE TEMP TABLE %s AS
			SELECT op, coalesce(after, before) AS after, _cdc_seq, _cdc_ord, _commit_ts, kafka_partition, kafka_offset, unchanged FROM %s`,
			rowsTable(t.id), decodedTable(t.id))); err != nil {
			return err
		}
		if rows[t].reconciles > 0 {
			if err := w.reconcile(ctx, t, decodedTable(t.id)); err != nil {
				return fmt.Errorf("reconcile %s with its copy: %w", t.schema.ID(), err)
			}
		}
	}
	return nil
}

// lakeWrite is a batch's lake files being written beside its
// transaction.
type lakeWrite struct {
	done  chan struct{}
	files []lakeFile
	err   error
	took  time.Duration
}

// wait returns the files once they are written and synced, or what
// stopped them (with those written so far).
func (lw *lakeWrite) wait() ([]lakeFile, error) {
	<-lw.done
	return lw.files, lw.err
}

// writeBatchLake writes each table's new events of the batch, from its
// decoded table, to lake files under staging names, dropping each decoded
// table once its files are written. It runs on a connection of its own
// (w.laker), beside the batch's transaction on the warehouse's, which
// records the files once they are written (lakeWrite.wait); it reads
// nothing the transaction writes. Files, not the warehouse: they are
// published only after the commit.
func (w *Warehouse) writeBatchLake(ctx context.Context, b Batch, order []*table) *lakeWrite {
	lw := &lakeWrite{done: make(chan struct{})}
	if err := w.openSide(ctx, &w.laker); err != nil {
		lw.err = fmt.Errorf("open a connection for the lake files: %w", err)
		close(lw.done)
		return lw
	}
	floor := w.floor
	if b.Watermark != nil {
		floor = max(floor, b.Watermark.Seq)
	}
	go func() {
		defer close(lw.done)
		stage.Enter(stage.Lake)
		start := time.Now()
		defer func() { lw.took = time.Since(start) }()
		for _, t := range order {
			tf, err := w.writeLake(ctx, t, b.Positions[t.topic].ID, floor, b.Watermark)
			lw.files = append(lw.files, tf...)
			if err == nil {
				// Freed as soon as it is written, not at the batch's end:
				// the transaction's merge runs meanwhile. Only memory is
				// at stake (the next batch replaces it): a warning.
				if _, derr := w.laker.ExecContext(ctx, "DROP TABLE "+decodedTable(t.id)); derr != nil {
					w.log.Warn("free a batch's decoded events", "table", t.schema.ID(), "err", derr)
				}
			}
			if err != nil {
				lw.err = fmt.Errorf("write lake files of %s: %w", t.schema.ID(), err)
				return
			}
		}
		if len(lw.files) > 0 {
			if err := w.lake.SyncStaging(); err != nil {
				lw.err = fmt.Errorf("sync the lake's staging directory: %w", err)
			}
		}
	}()
	return lw
}

// applyInTx is the batch's part in its transaction; it returns the lake
// files of the dead letters it wrote.
func (w *Warehouse) applyInTx(ctx context.Context, b Batch, lf *lakeWrite, order []*table, rows map[*table]rowsInfo, st *BatchStats, since func() time.Duration) ([]lake.File, error) {
	dead, err := w.deadLetters(ctx, b.Positions)
	if err != nil {
		return nil, err
	}
	st.Dead = dead
	files, err := w.writeDeadLetters(ctx, len(dead), b.Positions)
	if err == nil && len(files) > 0 {
		err = w.lake.SyncStaging()
	}
	if err != nil {
		return files, fmt.Errorf("write lake files of dead letters: %w", err)
	}
	if b.Watermark != nil {
		if order, err = w.redeem(ctx, order, rows); err != nil {
			return files, fmt.Errorf("judge the deferred changes again: %w", err)
		}
	}
	st.Decode += since()
	open := w.open
	w.open = b.Open
	if err = w.applyRows(ctx, order, rows, st, since); err != nil {
		w.open = open
		return files, err
	}
	written, err := lf.wait()
	if err != nil {
		return files, err
	}
	if err := w.recordLakeFiles(ctx, written); err != nil {
		return files, err
	}
	crash.Point(crash.Staged)
	if err := w.saveOffsetsBounded(ctx, b.Positions, b.Bounds); err != nil {
		return files, err
	}
	return files, w.recordBatch(ctx, b)
}

// fillUnchanged fills the values updates left unchanged (fillUnchangedSQL),
// again while that fills more: each round resolves one more link of a
// chain of key changes in the batch.
func (w *Warehouse) fillUnchanged(ctx context.Context, t *table) error {
	left := int64(-1)
	for {
		if _, err := w.conn.ExecContext(ctx, fillUnchangedSQL(t.schema, t.id, keyJSON(t, "r"))); err != nil {
			return err
		}
		var n int64
		if err := w.conn.QueryRowContext(ctx, unfilledSQL(t.schema, t.id)).Scan(&n); err != nil {
			return err
		}
		if n == 0 || n == left {
			return nil
		}
		left = n
	}
}

// rowsInfo is what reading a table's decoded events of the batch told.
type rowsInfo struct {
	// keyOnly: a delete's before image holds only the key.
	keyOnly bool
	// truncates counts the truncates of the table.
	truncates int
	// empty says silver holds no row of the table yet (a replay's first
	// chunk): its newest changes are inserted, with nothing to merge.
	empty bool
	// judgeOnly says the rows are there for the rules of the tables that
	// reference the table: they are judged, not applied (ReplayScope.Apply).
	judgeOnly bool
	// unchanged: an update left TOASTed values unchanged, which the
	// version before holds (fillUnchanged).
	unchanged bool
	// reconciles counts the reconcile marks of the table (reconcileSQL).
	reconciles int
}

// applyRows applies the decoded rows of the batch's tables (order): the
// contract rules and quarantine, the history, the merge into silver and
// the gold marts. The stream and the backfill both come here.
func (w *Warehouse) applyRows(ctx context.Context, order []*table, rows map[*table]rowsInfo, st *BatchStats, since func() time.Duration) error {
	for _, t := range order {
		if rows[t].unchanged {
			if err := w.fillUnchanged(ctx, t); err != nil {
				return fmt.Errorf("take the unchanged values of %s from the versions before: %w", t.schema.ID(), err)
			}
		}
	}
	var err error
	stage.Enter(stage.Rules)
	if st.Quarantined, st.Warned, err = w.applyRules(ctx, order, rows); err != nil {
		return err
	}
	crash.Point(crash.Rules)
	st.Rules = since()
	stage.Enter(stage.History)
	order = slices.DeleteFunc(slices.Clone(order), func(t *table) bool { return rows[t].judgeOnly })
	for _, t := range order {
		if t.history {
			if err := w.recordHistory(ctx, t, rows[t]); err != nil {
				return fmt.Errorf("record the history of %s: %w", t.schema.ID(), err)
			}
		}
	}
	crash.Point(crash.History)
	st.History = since()
	stage.Enter(stage.Merge)
	golden := w.goldReads(order)
	if err := w.changedBefore(ctx, golden, rows); err != nil {
		return err
	}
	for _, t := range order {
		latest := "(" + latestSQL(t.schema, t.id, rows[t], len(t.rules) > 0) + ")"
		if slices.Contains(golden, t) {
			latest = newestTable(t.id)
		}
		for _, stmt := range applySQL(t.schema, t.id, rows[t], latest) {
			if _, err := w.conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("apply %s batch: %w", t.schema.ID(), err)
			}
		}
	}
	crash.Point(crash.Merge)
	st.Merge = since()
	stage.Enter(stage.Gold)
	refreshed, err := w.refreshGold(ctx, golden, time.Now())
	if err != nil {
		return err
	}
	w.refreshing = refreshed
	crash.Point(crash.Gold)
	st.Gold = since()
	stage.Enter(stage.Commit) // bookkeeping, the commit and publishing the lake files
	return nil
}

// decode turns a table's staged envelopes into typed rows, moves those
// that cannot be applied to the batch's dead letters, drops those the
// warehouse already holds, and reports whether a delete carries its key
// alone and how many truncates are left.
func (w *Warehouse) decode(ctx context.Context, t *table, n *staged) (rowsInfo, error) {
	var info rowsInfo
	if err := w.decodeRows(ctx, t, n); err != nil {
		return info, err
	}
	rows := decodedTable(t.id)
	floor := w.tableFloor(t)
	var dead, ko, stale int
	if err := w.conn.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) FILTER (dlq_reason IS NOT NULL),
		count(*) FILTER (key_only AND dlq_reason IS NULL), count(*) FILTER (_cdc_seq <= %[1]d AND dlq_reason IS NULL),
		count(*) FILTER (op = 't' AND _cdc_seq > %[1]d AND dlq_reason IS NULL),
		count(*) FILTER (unchanged IS NOT NULL AND _cdc_seq > %[1]d AND dlq_reason IS NULL) > 0,
		count(*) FILTER (op = 'm' AND _cdc_seq > %[1]d AND dlq_reason IS NULL) FROM %[2]s`, floor, rows)).
		Scan(&dead, &ko, &stale, &info.truncates, &info.unchanged, &info.reconciles); err != nil {
		return info, err
	}
	// A reconcile's deletes carry the key alone.
	info.keyOnly = ko > 0 || info.reconciles > 0
	if dead > 0 {
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow_dead
			SELECT r.kafka_topic, r.kafka_partition, r.kafka_offset, %s, 'decode', r.dlq_reason, coalesce(s.raw, encode(s.v)), r._cdc_seq, r._cdc_ord
			FROM %s r JOIN `+stageTable+` s ON s.tbl = %d AND s.kafka_partition = r.kafka_partition AND s.kafka_offset = r.kafka_offset
			WHERE r.dlq_reason IS NOT NULL`, literal(t.schema.ID()), rows, t.id)); err != nil {
			return info, err
		}
	}
	if dead+stale > 0 {
		// Events at or before the last consistent batch are applied and in
		// the lake already (the Kafka log was read again from its start).
		// (A filter in the parse would decode every envelope twice.)
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("DELETE FROM %s WHERE dlq_reason IS NOT NULL OR _cdc_seq <= %d", rows, floor)); err != nil {
			return info, err
		}
	}
	if w.known[t] {
		// So are those a batch that was not consistent applied before the
		// log was lost.
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf(`DELETE FROM %s r USING lakeflow_known k
			WHERE k.tbl = %d AND k.seq = r._cdc_seq AND k.ord = r._cdc_ord`, rows, t.id)); err != nil {
			return info, err
		}
		if err := w.conn.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FILTER (op = 't'), count(*) FILTER (op = 'm') FROM %s", rows)).Scan(&info.truncates, &info.reconciles); err != nil {
			return info, err
		}
	}
	return info, nil
}

// tableFloor is the position at or before which t's events are applied:
// the last consistent batch's, but for a table released from parking
// whose changes are still coming, where it was parked.
func (w *Warehouse) tableFloor(t *table) change.LSN {
	if b := t.schema.Backlog; b != nil && w.floor < b.To {
		return min(w.floor, b.From-1)
	}
	return w.floor
}

// decodeRows makes the decoded table of a table's staged envelopes: parseSQL
// decodes those its flat decoder refused, into which the flat table is
// packed.
func (w *Warehouse) decodeRows(ctx context.Context, t *table, n *staged) error {
	if n == nil {
		n = &staged{}
	}
	var stmts []string
	if n.sql > 0 {
		stmts = append(stmts, t.parse)
	}
	if n.flat > 0 {
		pack := t.flat.create
		if n.sql > 0 {
			pack = t.flat.insert
		}
		stmts = append(stmts, pack, "DROP TABLE "+flatTable(t.id))
	}
	for _, stmt := range stmts {
		if _, err := w.conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("decode %s events: %w", t.schema.ID(), err)
		}
	}
	return nil
}

// recordBatch adds the batch to lakeflow.batches. Its committed_at is the
// time of this, the transaction's last statement, not now(): DuckDB's
// now() is when the transaction began, before the batch's rules, merge
// and gold, and freshness measured by it fell short by their time.
func (w *Warehouse) recordBatch(ctx context.Context, b Batch) error {
	lsn, end, commit := "NULL", "NULL", "NULL"
	if wm := b.Watermark; wm != nil {
		lsn, end = fmt.Sprint(uint64(wm.Seq)), fmt.Sprint(uint64(wm.End))
		if wm.Commit != 0 {
			commit = fmt.Sprintf("make_timestamptz(%d)", wm.Commit)
		}
	}
	_, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow.batches VALUES (%d, %t, %s, %s, %s, %d, make_timestamptz(%d))`,
		w.batch+1, b.Watermark != nil, lsn, end, commit, len(b.Records), time.Now().UnixMicro()))
	return err
}

// staged is a table's part of a batch being staged: how many of its
// envelopes its flat decoder read and how many parseSQL decodes, and,
// while staging, the Appender of its flat table.
type staged struct {
	flat, sql int
	appender  *duckdb.Appender
}

// Staged is a batch's records staged for ApplyStaged.
type Staged struct {
	tables map[*table]*staged
	took   time.Duration
	read   chan struct{}
}

// Read is closed once ApplyStaged has read the staged records into its
// own tables: the next batch may be staged from then on.
func (s *Staged) Read() <-chan struct{} { return s.read }

// The staging tables are in a database of their own, in memory and
// shared by the warehouse's connections (a TEMP table is its
// connection's alone): Stage fills them on the staging connection while
// the batch before runs its merge on the warehouse's.
const (
	scratchDB   = "lakeflow_scratch"
	stageTable  = scratchDB + ".lakeflow_stage"
	createStage = "CREATE OR REPLACE TABLE " + stageTable +
		" (tbl INTEGER, topic VARCHAR, kafka_partition INTEGER, kafka_offset BIGINT, v VARCHAR, raw BLOB)"
)

// Stage appends the envelopes of a batch with the Appender (row-by-row
// INSERT is two orders of magnitude slower): those a table's flat
// decoder reads to its flat table, made when its first one comes, the
// rest raw to the staging table. There, a record of a topic without a
// schema gets table -1 and keeps its topic (no other record does: a
// string a row costs the appender a sixth of its time), one that is not
// UTF-8 text keeps its bytes in raw; both become dead letters. Once it
// returns, nothing reads the records' values again.
//
// It runs on a connection of its own, beside the ApplyStaged of the batch
// before once that one's Read is closed (the staging tables are
// single), never beside ApplySchemas (the tables' decoders).
func (w *Warehouse) Stage(ctx context.Context, recs []Record) (*Staged, error) {
	start := time.Now()
	s := &Staged{tables: map[*table]*staged{}, read: make(chan struct{})}
	if err := w.openSide(ctx, &w.stager); err != nil {
		return nil, fmt.Errorf("batch: open a connection to stage on: %w", err)
	}
	if _, err := w.stager.ExecContext(ctx, createStage); err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	err := w.stager.Raw(func(dc any) error {
		conn := dc.(driver.Conn)
		raw, err := duckdb.NewAppender(conn, scratchDB, "main", "lakeflow_stage")
		if err != nil {
			return err
		}
		err = w.appendRecords(ctx, conn, raw, s.tables, recs)
		err = errors.Join(err, raw.Close())
		for _, st := range s.tables {
			if st.appender != nil {
				err = errors.Join(err, st.appender.Close())
				st.appender = nil
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	s.took = time.Since(start)
	return s, nil
}

// appendRecords appends each record to its flat table if its table's flat
// decoder reads it, else to the staging table (raw).
func (w *Warehouse) appendRecords(ctx context.Context, conn driver.Conn, raw *duckdb.Appender, tables map[*table]*staged, recs []Record) error {
	for _, r := range recs {
		t := w.byTopic[r.Topic]
		var st *staged
		if t != nil {
			if st = tables[t]; st == nil {
				st = &staged{}
				tables[t] = st
			}
		}
		valid := utf8.Valid(r.Value)
		if t != nil && t.flat != nil && valid && t.flat.decode(r.Value) {
			if st.appender == nil {
				if _, err := conn.(driver.ExecerContext).ExecContext(ctx,
					fmt.Sprintf("CREATE OR REPLACE TABLE %s (%s)", flatTable(t.id), t.flat.ddl()), nil); err != nil {
					return err
				}
				a, err := duckdb.NewAppender(conn, scratchDB, "main", flatName(t.id))
				if err != nil {
					return err
				}
				st.appender = a
			}
			row := t.flat.row
			meta := row[len(row)-flatFields:]
			meta[flatPartition], meta[flatOffset] = r.Partition, r.Offset
			if err := st.appender.AppendRow(row...); err != nil {
				return err
			}
			st.flat++
			continue
		}
		var id, topic any = int32(-1), r.Topic
		if t != nil {
			id, topic = int32(t.id), nil
			st.sql++
		}
		var v, rawValue any = r.Value, nil
		if !valid {
			v, rawValue = nil, r.Value
		}
		if err := raw.AppendRow(id, topic, r.Partition, r.Offset, v, rawValue); err != nil {
			return err
		}
	}
	return nil
}
