package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/sql/gold"
	"github.com/lakeflow/lakeflow/warehouse"
)

// AsOfOptions say what lakeflow asof builds.
type AsOfOptions struct {
	// Position is the point of the log, in any form PositionForms lists.
	Position string
	// Table, if set, is the one table asked for. A silver table is built
	// alone (with the tables its contract's rules read); history tables
	// and gold marts need everything.
	Table string
	// Out, if set, is a new DuckDB file to write the whole as-of
	// warehouse to.
	Out string
	// checkpoint builds, at Out, a state checkpoint (BuildCheckpoint):
	// no gold marts, its manifest, and a replay in chunks.
	checkpoint bool
}

// PositionForms are the positions lakeflow asof takes.
const PositionForms = "an LSN (0/1A2B3C4), a _cdc_seq (27439044), a Kafka record (<topic>:<partition>:<offset>), " +
	"a commit time (RFC 3339, 2024-07-01T09:00:00+02:00, or a day, 2024-07-01, meaning its start in UTC), or a recorded batch (batch:42, see --list)"

// AsOf is the warehouse as of a position, built from the lake alone
// through the stream's transforms: silver (soft-deleted rows included,
// as silver keeps them), the quarantine, and unless one silver table was
// asked for, the history and the gold marts. Close it when done.
type AsOf struct {
	*warehouse.Warehouse
	// Bound is the position resolved.
	Bound warehouse.Bound
	// After says the position is after the lake's last event: this is the
	// latest state, Last.
	After bool
	Last  warehouse.LakeEvent
	// Held says a batch was being published (or a crash left one half
	// published): the state is as of Bound, the last position whose
	// batches the lake holds whole.
	Held bool
	// Split says the lake's last changes hold part of a transaction
	// (larger than the batch limits, its rest not written yet): the state
	// is as of Bound, the last batch that ended at a transaction boundary.
	Split bool
	// Relation is the table asked for, as SQL; Silver says it is a silver
	// table (Key lists its key columns).
	Relation string
	Silver   bool
	Key      []string
	// From is the position of the state checkpoint the build started
	// from (0: the lake's start).
	From    change.LSN
	Stats   warehouse.ReplayStats
	Seconds float64
}

// BuildAsOf builds the warehouse as of opts.Position from the lake. It
// never opens the live warehouse and takes no lock: it runs beside
// lakeflow run.
func BuildAsOf(ctx context.Context, cfg *config.Config, opts AsOfOptions, log *slog.Logger) (*AsOf, error) {
	t0 := time.Now()
	pos, err := parsePosition(opts.Position)
	if err != nil {
		return nil, err
	}
	path := ""
	if opts.Out != "" {
		if _, err := os.Stat(opts.Out); err == nil {
			return nil, fmt.Errorf("%w: --out %s exists: remove it or name a new file", fault.ErrConfig, opts.Out)
		}
		path = fmt.Sprintf("%s.%d.tmp", opts.Out, os.Getpid())
		for _, p := range []string{path, path + ".wal"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
			}
		}
	}
	wh, loaded, err := lakeView(ctx, cfg, path, warehouse.View{History: true}, log)
	if err != nil {
		return nil, err
	}
	a := &AsOf{Warehouse: wh}
	fail := func(err error) (*AsOf, error) {
		wh.Close()
		if path != "" {
			os.Remove(path)
			os.Remove(path + ".wal")
		}
		return nil, err
	}
	ls, err := wh.ReadLakeState(ctx)
	if err != nil {
		return fail(err)
	}
	if opts.checkpoint {
		// Compaction goes on while a checkpoint is built; where the lake
		// cannot have links made (parts of it on other file systems), the
		// build reads its files holding compaction's swaps off, as asof.
		if err := wh.ReadByLinks(opts.Out + ".lake"); err != nil {
			log.Warn("the checkpoint's build holds the lake's files (compaction waits for it): it cannot link them", "err", fault.OneLine(err.Error()))
		}
	}
	if len(ls.Schemas) == 0 {
		return fail(fmt.Errorf("%w: %w", fault.ErrConfig, &noEventsError{cfg.Lake.Dir}))
	}
	// asked is the source ID of the silver table asked for, if one was.
	asked := ""
	if opts.Table != "" {
		name := strings.TrimPrefix(opts.Table, "silver.")
		for _, s := range ls.Newest() {
			if s.Table.Name == name {
				asked, a.Relation, a.Silver = s.Table.ID(), "silver."+quoteIdent(name), true
				for _, i := range s.Table.KeyColumns() {
					a.Key = append(a.Key, quoteIdent(s.Table.Columns[i].Name))
				}
			}
		}
		if asked == "" {
			a.Relation = opts.Table
		}
	}
	silverOnly := asked != ""
	if silverOnly {
		wh.ForSilver() // one silver table: no history or quarantine asked for
	}
	if err := a.resolve(ctx, pos, ls); err != nil {
		return fail(err)
	}
	complete, err := wh.Complete()
	if err != nil {
		return fail(err)
	}
	if a.Bound.Seq > complete {
		a.Bound.Seq, a.Held = complete, true
	}
	if whole, after, ok, err := wh.LastWhole(ctx); err != nil {
		return fail(err)
	} else if ok && after && a.Bound.Seq > whole {
		a.Bound.Seq, a.Split = whole, true
	}
	if opts.checkpoint {
		whole, _, ok, err := wh.LastWhole(ctx)
		if err != nil {
			return fail(err)
		}
		if !ok {
			whole = 0
		}
		a.Bound.Seq = checkpointAt(a.Bound.Seq, a.Last.Seq, whole, ls.Newest())
	}
	set, err := loaded()
	if err != nil {
		return fail(err)
	}
	var marts []gold.Mart
	withMarts := !silverOnly && !opts.checkpoint
	if withMarts {
		if marts, err = loadMarts(cfg); err != nil {
			return fail(err)
		}
	}
	if opts.Table != "" && asked == "" {
		if err := knownRelation(cfg, ls, set, marts, opts.Table); err != nil {
			return fail(err)
		}
	}
	schemas := ls.Schemas
	var tables map[string]bool
	if silverOnly {
		tables = readBy(set, asked)
		schemas = schemas[:0:0]
		for _, s := range ls.Schemas {
			if tables[s.Table.ID()] {
				schemas = append(schemas, s)
			}
		}
	}
	if err := wh.ApplyVersions(ctx, schemas, kafka.SchemaTopic(cfg.Kafka.TopicPrefix)); err != nil {
		return fail(err)
	}
	if err := wh.SetContracts(ctx, set); err != nil {
		return fail(err)
	}
	inputs := warehouse.InputsOf(set, ls.Schemas)
	if a.From, err = startFromCheckpoint(ctx, cfg, wh, inputs, a.Bound.Seq, log); err != nil {
		return fail(err)
	}
	scope := warehouse.ReplayScope{Upto: &a.Bound, Tables: tables, From: a.From}
	if silverOnly {
		scope.Apply = map[string]bool{asked: true} // the tables its rules read are judged, not merged
	}
	if opts.checkpoint {
		scope.ChunkEvents = replayChunk
	}
	if a.Stats, err = wh.Replay(ctx, scope); err != nil {
		return fail(err)
	}
	if withMarts {
		if err := giveMarts(ctx, cfg, wh, marts); err != nil {
			return fail(err)
		}
	}
	if opts.checkpoint {
		err = wh.WriteCheckpointManifest(ctx, a.Bound, inputs)
	} else {
		err = wh.RecordAsOf(ctx, opts.Position, a.Bound, pos.time)
	}
	if err != nil {
		return fail(err)
	}
	if opts.Out == "" {
		// Tables by their names alone, as in the warehouse's own schemas.
		if err := wh.SearchPath(ctx, "silver", "gold", "lakeflow"); err != nil {
			return fail(err)
		}
	} else {
		if err := wh.DropState(ctx); err != nil {
			return fail(err)
		}
		if err := wh.Close(); err != nil {
			return fail(err)
		}
		// A link, not a rename: a file made at --out meanwhile stays.
		err := os.Link(path, opts.Out)
		os.Remove(path)
		if err != nil {
			return nil, fmt.Errorf("%w: write --out %s: %v", fault.ErrEnvironment, opts.Out, err)
		}
		a.Warehouse = nil
	}
	a.Seconds = time.Since(t0).Seconds()
	return a, nil
}

// Close closes the as-of warehouse (an --out one is closed already).
func (a *AsOf) Close() error {
	if a.Warehouse == nil {
		return nil
	}
	return a.Warehouse.Close()
}

// readBy is the set of tables (source IDs) to build for the table with
// source ID id: it, and the tables its contract's existence rules read,
// and theirs.
func readBy(set contracts.Set, id string) map[string]bool {
	out := map[string]bool{}
	var add func(id string)
	add = func(id string) {
		if out[id] {
			return
		}
		out[id] = true
		if c := set[id]; c != nil {
			for _, r := range c.Rules {
				if r.References != nil {
					add(r.References.Table.String())
				}
			}
		}
	}
	add(id)
	return out
}

// position is a parsed position: one of its fields is set.
type position struct {
	seq   change.LSN
	isSeq bool
	time  time.Time
	kafka *kafkaRecord
	batch int64
}

type kafkaRecord struct {
	topic     string
	partition int32
	offset    int64
}

var (
	lsnForm   = regexp.MustCompile(`^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$`)
	kafkaForm = regexp.MustCompile(`^([A-Za-z0-9._-]+):(\d+):(\d+)$`)
	batchForm = regexp.MustCompile(`^batch:(\d+)$`)
	localTime = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$`)
)

// parsePosition parses a position in any of PositionForms.
func parsePosition(s string) (position, error) {
	var p position
	s = strings.TrimSpace(s)
	bad := func(why string) (position, error) {
		return p, fmt.Errorf("%w: position %q %s; give %s", fault.ErrQuery, s, why, PositionForms)
	}
	switch {
	case s == "":
		return bad("is empty")
	case lsnForm.MatchString(s):
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			return bad("is not an LSN")
		}
		p.seq, p.isSeq = change.LSN(l), true
	case strings.Trim(s, "0123456789") == "":
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return bad("is too large for a _cdc_seq")
		}
		p.seq, p.isSeq = change.LSN(n), true
	case batchForm.MatchString(s):
		n, err := strconv.ParseInt(batchForm.FindStringSubmatch(s)[1], 10, 64)
		if err != nil || n == 0 {
			return bad("names no batch")
		}
		p.batch = n
	case localTime.MatchString(s):
		return bad("has no zone: add one (Z for UTC, or an offset like +02:00)")
	case kafkaForm.MatchString(s):
		m := kafkaForm.FindStringSubmatch(s)
		part, err1 := strconv.ParseInt(m[2], 10, 32)
		off, err2 := strconv.ParseInt(m[3], 10, 64)
		if err1 != nil || err2 != nil {
			return bad("has a partition or offset out of range")
		}
		p.kafka = &kafkaRecord{topic: m[1], partition: int32(part), offset: off}
	default:
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t, err = time.Parse(time.DateOnly, s)
		}
		if err != nil {
			return bad("is not one lakeflow reads")
		}
		p.time = t.UTC()
	}
	return p, nil
}

// resolve turns a parsed position into a bound on the lake, and says
// when it lies outside the lake's events.
func (a *AsOf) resolve(ctx context.Context, p position, ls warehouse.LakeState) error {
	first, last, ok, err := a.LakeEnds(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: the lake holds no events yet", fault.ErrConfig)
	}
	a.Last = last
	switch {
	case p.isSeq:
		a.Bound.Seq = p.seq
	case p.batch > 0:
		bs, err := a.BatchPositions(ctx, 0, p.batch)
		if err != nil {
			return err
		}
		if len(bs) == 0 {
			return fmt.Errorf("%w: no lake file names batch %d: a batch that applied no events writes none, and holds the state of the batch before it (lakeflow asof --list shows the batches the lake names; lakeflow status, the published batch's LSN, which asof takes)", fault.ErrQuery, p.batch)
		}
		a.Bound.Seq = bs[0].Seq
	case p.kafka != nil:
		var t *change.Table
		var topics []string
		for _, s := range ls.Schemas {
			if !slices.Contains(topics, s.Topic) {
				topics = append(topics, s.Topic)
			}
			if s.Topic == p.kafka.topic {
				t = s.Table
			}
		}
		if t == nil {
			return fmt.Errorf("%w: topic %s holds no table of the lake (its topics: %s)", fault.ErrQuery, p.kafka.topic, strings.Join(topics, ", "))
		}
		seq, after, err := a.KafkaSeq(ctx, t, p.kafka.topic, p.kafka.partition, p.kafka.offset)
		switch {
		case errors.Is(err, warehouse.ErrNotInLake):
			return fmt.Errorf("%w: offset %d of %s partition %d is not in the lake (before its first record there, or a dead letter)",
				fault.ErrQuery, p.kafka.offset, p.kafka.topic, p.kafka.partition)
		case err != nil:
			return err
		case after:
			a.Bound.Seq, a.After = last.Seq, true
			return nil
		}
		a.Bound.Seq = seq
	default:
		seq, after, err := a.PrefixAt(ctx, p.time)
		switch {
		case err != nil:
			return err
		case after:
			a.Bound.Seq, a.After = last.Seq, true
			return nil
		case seq < first.Seq:
			return fmt.Errorf("%w: %s is before the lake's first event (committed %s): nothing was captured yet", fault.ErrQuery,
				p.time.Format(time.RFC3339Nano), first.Commit.Format(time.RFC3339Nano))
		}
		a.Bound.Seq = seq
	}
	if a.Bound.Seq < first.Seq {
		return fmt.Errorf("%w: %s (_cdc_seq %d) is before the lake's first event (%s, committed %s): nothing was captured yet", fault.ErrQuery,
			a.Bound.Seq, uint64(a.Bound.Seq), first.Seq, first.Commit.Format(time.RFC3339Nano))
	}
	if a.Bound.Seq > last.Seq {
		// A batch's position is its commit's end, past its last event:
		// up to the newest batch's, a position is one the lake records.
		bs, err := a.BatchPositions(ctx, 1, 0)
		if err != nil {
			return err
		}
		a.After = len(bs) == 0 || a.Bound.Seq > bs[0].Seq
	}
	return nil
}

// knownRelation refuses a --table that names none of the tables an as-of
// warehouse holds besides silver's (whose names the caller matched), before
// the lake is replayed for it: a history table, a gold mart, the
// quarantine; a captured table the lake holds no event of yet is said to
// be one. A name with quotes is left to DuckDB.
func knownRelation(cfg *config.Config, ls warehouse.LakeState, set contracts.Set, marts []gold.Mart, name string) error {
	if strings.ContainsAny(name, `"' `) {
		return nil
	}
	var silver, others []string
	for _, s := range ls.Newest() {
		silver = append(silver, "silver."+s.Table.Name)
		if c := set.For(s.Table.Schema, s.Table.Name); c != nil && c.History {
			others = append(others, "silver."+s.Table.Name+"_history")
		}
	}
	for _, m := range marts {
		others = append(others, "gold."+m.Name)
	}
	others = append(others, "lakeflow.quarantine")
	for _, known := range others {
		_, bare, _ := strings.Cut(known, ".")
		if strings.EqualFold(name, known) || strings.EqualFold(name, bare) {
			return nil
		}
	}
	for _, t := range cfg.Source.Tables {
		if strings.EqualFold(name, t.Name) || strings.EqualFold(name, "silver."+t.Name) {
			return fmt.Errorf("%w: the lake holds no events yet of %s.%s (captured: its snapshot may be under way)", fault.ErrQuery, t.Schema, t.Name)
		}
	}
	slices.Sort(silver)
	// A typo is matched against names written as it is: bare, or whole.
	known := slices.Concat(silver, others)
	if !strings.Contains(name, ".") {
		for i, k := range known {
			_, known[i], _ = strings.Cut(k, ".")
		}
	}
	return fmt.Errorf("%w: --table %s is no table of the warehouse as of a position%s: it holds %s, and %s", fault.ErrQuery, name,
		fault.DidYouMean(name, known), strings.Join(silver, ", "), strings.Join(others, ", "))
}

// lakeView opens a warehouse that reads the lake (in memory, or at
// path) and never writes it, and loads the contracts meanwhile: loaded
// waits for them. (Loading them costs about 30 ms, as much as opening
// the warehouse and reading the lake's state, which need not wait.)
func lakeView(ctx context.Context, cfg *config.Config, path string, v warehouse.View, log *slog.Logger) (wh *warehouse.Warehouse, loaded func() (contracts.Set, error), err error) {
	lk, err := lake.OpenExisting(cfg.Lake.Dir)
	if err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	var set contracts.Set
	var setErr error
	go func() {
		defer close(done)
		set, setErr = loadContracts(cfg, log)
	}()
	loaded = func() (contracts.Set, error) {
		<-done
		return set, setErr
	}
	if wh, err = warehouse.OpenView(ctx, path, cfg.Warehouse, lk, log, v); err != nil {
		<-done
		return nil, nil, err
	}
	return wh, loaded, nil
}

// quoteIdent quotes a SQL identifier (DuckDB and PostgreSQL alike).
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// AsOfBatches lists the last n positions the pipeline recorded (its
// consistent batches), newest first, from the lake's files.
func AsOfBatches(ctx context.Context, cfg *config.Config, n int, log *slog.Logger) ([]warehouse.BatchPosition, error) {
	lk, err := lake.OpenExisting(cfg.Lake.Dir)
	if err != nil {
		return nil, err
	}
	wh, err := warehouse.OpenView(ctx, "", cfg.Warehouse, lk, log, warehouse.View{})
	if err != nil {
		return nil, err
	}
	defer wh.Close()
	return wh.BatchPositions(ctx, n, 0)
}
