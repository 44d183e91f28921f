package postgres_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &pg) }

// memSink keeps everything in memory and acknowledges at once.
type memSink struct {
	mu      sync.Mutex
	events  []change.Event
	schemas []*change.Table
	state   *change.SourceState
	durable change.LSN
	// delay slows every event down (a backlog downstream).
	delay time.Duration
}

func (s *memSink) Schema(_ context.Context, t *change.Table) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.schemas = append(s.schemas, t)
	return nil
}

// Event keeps a deep copy: the source reuses its buffers.
func (s *memSink) Event(_ context.Context, ev *change.Event) error {
	time.Sleep(s.delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	c := *ev
	c.Before, c.After = copyRow(ev.Before), copyRow(ev.After)
	s.events = append(s.events, c)
	return nil
}

func copyRow(r []change.Datum) []change.Datum {
	if r == nil {
		return nil
	}
	out := make([]change.Datum, len(r))
	for i, d := range r {
		out[i] = change.Datum{Null: d.Null, Text: append([]byte(nil), d.Text...)}
	}
	return out
}

func (s *memSink) EndTxn(b change.Boundary) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.durable = b.End
}

func (s *memSink) Durable() change.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durable
}

func (s *memSink) Flush(context.Context) error { return nil }

func (s *memSink) Track(context.Context, *change.Table) error { return nil }

func (s *memSink) LoadState(context.Context) (*change.SourceState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, nil
}

func (s *memSink) SaveState(_ context.Context, st change.SourceState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = &st
	return nil
}

func (s *memSink) LoadSchemas(context.Context) (map[string]*change.Table, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]*change.Table{}
	for _, t := range s.schemas {
		out[t.ID()] = t
	}
	return out, nil
}

func drain(t *testing.T, dsn string, sink *memSink, tables ...string) error {
	t.Helper()
	return drainWith(t, postgres.SourceConfig{DSN: dsn}, sink, tables...)
}

// drainWith runs a source configured as cfg (with defaults for what it
// leaves unset) until the WAL written before the call is delivered.
func drainWith(t *testing.T, cfg postgres.SourceConfig, sink *memSink, tables ...string) error {
	t.Helper()
	src := postgres.NewSource(sourceConfig(cfg, tables), slog.New(slog.NewTextHandler(io.Discard, nil)))
	done := make(chan struct{})
	close(done)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return src.Run(ctx, sink, sink, done)
}

func sourceConfig(cfg postgres.SourceConfig, tables []string) postgres.SourceConfig {
	for _, tb := range tables {
		cfg.Tables = append(cfg.Tables, config.Table{Schema: "public", Name: tb})
	}
	if cfg.Slot == "" {
		cfg.Slot, cfg.Publication = "s", "p"
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = time.Second
	}
	return cfg
}

func TestUnchangedToastIsFilledFromOldRow(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn,
		"CREATE TABLE big (id int PRIMARY KEY, small int, big text)",
		"ALTER TABLE big REPLICA IDENTITY FULL",
		"SELECT 1")
	sink := &memSink{}
	if err := drain(t, dsn, sink, "big"); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, dsn,
		"INSERT INTO big VALUES (1, 0, (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g))",
		"UPDATE big SET small = 1 WHERE id = 1")
	if err := drain(t, dsn, sink, "big"); err != nil {
		t.Fatal(err)
	}
	if len(sink.events) != 2 {
		t.Fatalf("got %d events, want insert and update", len(sink.events))
	}
	ins, upd := sink.events[0], sink.events[1]
	if upd.Op != change.OpUpdate || string(upd.After[2].Text) != string(ins.After[2].Text) || len(upd.After[2].Text) != 12800 {
		t.Fatalf("update after-image big has %d bytes, want the 12800 of the insert", len(upd.After[2].Text))
	}
}
