package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/warehouse"
)

// StatusReport is what lakeflow status says. A part it cannot learn (the
// source or Kafka down, nothing published yet) is left out, with a note.
type StatusReport struct {
	Published *PublishedStatus `json:"published,omitempty"`
	LastBatch *BatchStatus     `json:"last_batch,omitempty"`
	Slot      *SlotStatus      `json:"slot,omitempty"`
	// InactiveSlots are the source database's other slots no one reads:
	// each holds WAL until it is dropped.
	InactiveSlots []postgres.InactiveSlot `json:"inactive_slots,omitempty"`
	// Copies are the tables being copied while the stream runs (added,
	// or resynced), as of the published copy.
	Copies []change.TableCopy `json:"copies,omitempty"`
	// Parked are the tables whose change of shape waits for a contract
	// edit or a resync (and those released, catching up), as of the
	// published copy.
	Parked   []change.ParkedTable `json:"parked,omitempty"`
	Topics   []TopicLag           `json:"consumer_lag,omitempty"`
	Datasets []DatasetFreshness   `json:"freshness,omitempty"`
	Held     HeldStatus           `json:"held"`
	Lake     map[string]LakeTable `json:"lake"`
	Notes    []string             `json:"notes,omitempty"`
}

// PublishedStatus is the published copy: the batch and source position it
// holds, and its age.
type PublishedStatus struct {
	Batch      int64     `json:"batch"`
	Seq        uint64    `json:"cdc_seq"`
	LSN        string    `json:"lsn"`
	CommitTime time.Time `json:"commit_ts"`
	At         time.Time `json:"published_at"`
	AgeSeconds float64   `json:"age_seconds"`
}

// BatchStatus is the last committed batch, and the rate over the last
// minute of batches.
type BatchStatus struct {
	Batch           int64     `json:"batch"`
	At              time.Time `json:"committed_at"`
	Events          int64     `json:"events"`
	Consistent      bool      `json:"consistent"`
	LSN             string    `json:"lsn,omitempty"`
	EventsPerSecond float64   `json:"events_per_second_last_minute"`
}

// SlotStatus is how far the replication slot is behind the source's WAL.
type SlotStatus struct {
	Name     string `json:"name"`
	Active   bool   `json:"active"`
	LagBytes int64  `json:"lag_bytes"`
	// LagSeconds is PostgreSQL's flush lag while the slot streams.
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
}

// TopicLag is how many records of a topic the published warehouse has
// not applied.
type TopicLag struct {
	Topic string `json:"topic"`
	Lag   int64  `json:"lag"`
}

// DatasetFreshness is a silver table's newest change against its SLA.
type DatasetFreshness struct {
	Dataset    string  `json:"dataset"`
	AgeSeconds float64 `json:"age_seconds"`
	SLASeconds float64 `json:"sla_seconds,omitempty"`
	Breach     bool    `json:"breach"`
}

// HeldStatus counts the quarantine and the dead letters.
type HeldStatus struct {
	Quarantined int64            `json:"quarantined"`
	TopRules    map[string]int64 `json:"top_rules,omitempty"`
	Dead        int64            `json:"dead_lettered"`
}

// LakeTable is a lake table's files.
type LakeTable struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// Status reports the pipeline's state from the published warehouse, the
// lake, the source and Kafka, never taking the writer's lock; it works
// whether or not a pipeline runs.
func Status(ctx context.Context, cfg *config.Config, log *slog.Logger) (*StatusReport, error) {
	r := &StatusReport{Lake: map[string]LakeTable{}}
	if err := r.lake(cfg.Lake.Dir); err != nil {
		return nil, err
	}
	rd, err := warehouse.OpenReader(ctx, cfg.Warehouse.Path)
	if err != nil {
		r.Notes = append(r.Notes, fault.OneLine(err.Error()))
		return r, nil
	}
	defer rd.Close()
	if err := r.warehouse(ctx, rd, cfg); err != nil {
		return nil, err
	}
	r.slot(ctx, cfg)
	r.consumerLag(ctx, cfg, rd)
	return r, nil
}

// lake counts each table's files and bytes.
func (r *StatusReport) lake(dir string) error {
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".parquet") {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		table, _, _ := strings.Cut(rel, string(filepath.Separator))
		if table == "_staging" {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		lt := r.Lake[table]
		lt.Files++
		lt.Bytes += info.Size()
		r.Lake[table] = lt
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// warehouse reads the published copy: its position, the last batch, the
// quarantine and dead letters, and each silver table's newest change.
func (r *StatusReport) warehouse(ctx context.Context, rd *warehouse.Reader, cfg *config.Config) error {
	var p PublishedStatus
	if err := rd.QueryRow(ctx, "SELECT batch, coalesce(_cdc_seq, 0), coalesce(commit_ts, 'epoch'::TIMESTAMPTZ), published_at FROM lakeflow.published",
		&p.Batch, &p.Seq, &p.CommitTime, &p.At); err == nil {
		p.LSN, p.AgeSeconds = change.LSN(p.Seq).String(), time.Since(p.At).Seconds()
		r.Published = &p
	} else {
		r.Notes = append(r.Notes, "warehouse.path is not a published copy (written by a lakeflow before publishing)")
	}
	var b BatchStatus
	var lsn *uint64
	if err := rd.QueryRow(ctx, `SELECT batch, committed_at, events, consistent, lsn,
		(SELECT coalesce(sum(events), 0) FROM lakeflow.batches WHERE committed_at > now() - INTERVAL 1 MINUTE) / 60.0
		FROM lakeflow.batches ORDER BY batch DESC LIMIT 1`, &b.Batch, &b.At, &b.Events, &b.Consistent, &lsn, &b.EventsPerSecond); err == nil {
		if lsn != nil {
			b.LSN = change.LSN(*lsn).String()
		}
		r.LastBatch = &b
	}
	if s := publishedState(ctx, rd); s != nil {
		r.Copies, r.Parked = s.Copies, s.Parked
	}
	if err := rd.QueryRow(ctx, "SELECT count(*) FROM lakeflow.quarantine", &r.Held.Quarantined); err != nil {
		return err
	}
	if err := rd.QueryRow(ctx, "SELECT count(*) FROM lakeflow.dlq", &r.Held.Dead); err != nil {
		return err
	}
	rules, err := rd.Query(ctx, "SELECT rule, count(*) FROM (SELECT unnest(rules) AS rule FROM lakeflow.quarantine) GROUP BY rule ORDER BY 2 DESC, 1 LIMIT 5", false)
	if err != nil {
		return err
	}
	if len(rules.Rows) > 0 {
		r.Held.TopRules = map[string]int64{}
		for _, row := range rules.Rows {
			var n int64
			fmt.Sscan(*row[1], &n)
			r.Held.TopRules[*row[0]] = n
		}
	}
	set, err := loadContracts(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	for _, t := range cfg.Source.Tables {
		var newest *time.Time
		if rd.QueryRow(ctx, "SELECT max(_commit_ts) FROM silver."+quoteIdent(t.Name), &newest) != nil || newest == nil {
			continue
		}
		f := DatasetFreshness{Dataset: "silver." + t.Name, AgeSeconds: time.Since(*newest).Seconds()}
		if c := set[t.String()]; c != nil && c.Freshness > 0 {
			f.SLASeconds = c.Freshness.Seconds()
			f.Breach = f.AgeSeconds > f.SLASeconds
		}
		r.Datasets = append(r.Datasets, f)
	}
	return nil
}

// slot reads the replication slot's lag from the source, if it answers.
func (r *StatusReport) slot(ctx context.Context, cfg *config.Config) {
	dsn := cfg.Source.DSN
	if dsn == "" {
		e := cfg.Source.Embedded
		var err error
		if dsn, err = postgres.RunningDSN(e.Dir, e.Port, e.Database); err != nil {
			r.Notes = append(r.Notes, "the embedded source has not been created yet")
			return
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		r.Notes = append(r.Notes, "the source does not answer (the embedded one runs only with lakeflow run): no slot lag")
		return
	}
	defer conn.Close(context.Background())
	if r.InactiveSlots, err = postgres.InactiveSlots(ctx, dsn, cfg.Source.Slot); err != nil {
		r.Notes = append(r.Notes, "the source's other replication slots could not be read: "+err.Error())
	}
	s := SlotStatus{Name: cfg.Source.Slot}
	var lag *float64
	err = conn.QueryRow(ctx, `SELECT s.active, pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint,
		extract(epoch FROM r.flush_lag)::float8
		FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, s.Name).Scan(&s.Active, &s.LagBytes, &lag)
	if err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("no replication slot %s at the source", s.Name))
		return
	}
	s.LagSeconds = lag
	r.Slot = &s
}

// consumerLag compares Kafka's end offsets, for every table topic and the
// watermark topic, with the offsets the published warehouse holds (none
// yet for a topic no batch has read: all of it is lag), if Kafka answers.
// The watermark topic lags only while table records do.
func (r *StatusReport) consumerLag(ctx context.Context, cfg *config.Config, rd *warehouse.Reader) {
	brokers := cfg.Kafka.Brokers
	if cfg.Kafka.Embedded() {
		brokers = []string{cfg.Kafka.Listen}
	}
	tables, err := rd.Query(ctx, "SELECT topic FROM lakeflow.tables ORDER BY topic", false)
	if err != nil || len(tables.Rows) == 0 {
		return
	}
	committed, err := rd.Query(ctx, `SELECT topic, "partition", next_offset FROM lakeflow.offsets`, false)
	if err != nil {
		return
	}
	topics := []string{kafka.WatermarkTopic(cfg.Kafka.TopicPrefix)}
	for _, row := range tables.Rows {
		topics = append(topics, *row[0])
	}
	next := map[string]map[int32]int64{}
	for _, row := range committed.Rows {
		var part int32
		var off int64
		fmt.Sscan(*row[1], &part)
		fmt.Sscan(*row[2], &off)
		if next[*row[0]] == nil {
			next[*row[0]] = map[int32]int64{}
		}
		next[*row[0]][part] = off
	}
	cons, err := kafka.NewConsumer(kafka.Config{Brokers: brokers, Prefix: cfg.Kafka.TopicPrefix})
	if err != nil {
		return
	}
	defer cons.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	end, err := cons.EndOffsets(ctx, topics)
	if err != nil {
		r.Notes = append(r.Notes, "Kafka does not answer (the embedded broker runs only with lakeflow run): no consumer lag")
		return
	}
	var behind int64
	for _, t := range topics {
		var lag int64
		for p, e := range end[t] {
			lag += max(e-next[t][p], 0)
		}
		r.Topics = append(r.Topics, TopicLag{Topic: t, Lag: lag})
		if t != topics[0] {
			behind += lag
		}
	}
	if behind == 0 {
		// Watermarks that bound no record left to apply (heartbeats,
		// which make no batch) are no lag.
		r.Topics[0].Lag = 0
	}
}

// publishedState is the source's state as the published copy holds it,
// or nil.
func publishedState(ctx context.Context, rd *warehouse.Reader) *change.SourceState {
	var state string
	if rd.QueryRow(ctx, "SELECT state::VARCHAR FROM lakeflow.source_state WHERE id = 1", &state) != nil {
		return nil
	}
	var s change.SourceState
	if json.Unmarshal([]byte(state), &s) != nil {
		return nil
	}
	return &s
}
