package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// running is a source running in the background.
type running struct {
	src    *postgres.Source
	done   chan struct{} // closed when Run returned
	err    error
	cancel context.CancelFunc
}

// parks waits until the source has parked public.t for a reason that
// says want.
func (r *running) parks(t *testing.T, want string) {
	t.Helper()
	waitFor(t, "public.t parked", func() bool {
		select {
		case <-r.done:
			t.Fatalf("the source stopped: %v", r.err)
		default:
		}
		p := r.src.Parked()
		return len(p) == 1 && p[0].Table == "public.t" && strings.Contains(p[0].Reason, want)
	})
}

// follow runs a source until the test ends.
func follow(t *testing.T, dsn string, sink *memSink, tables ...string) *running {
	t.Helper()
	return followWith(t, postgres.SourceConfig{DSN: dsn, Heartbeat: 100 * time.Millisecond}, sink, tables...)
}

func followWith(t *testing.T, cfg postgres.SourceConfig, sink *memSink, tables ...string) *running {
	t.Helper()
	src := postgres.NewSource(sourceConfig(cfg, tables), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{src: src, done: make(chan struct{}), cancel: cancel}
	go func() {
		r.err = src.Run(ctx, sink, sink, nil)
		close(r.done)
	}()
	t.Cleanup(func() { cancel(); <-r.done })
	select {
	case <-src.Streaming():
	case <-r.done:
		t.Fatalf("source stopped before streaming: %v", r.err)
	}
	return r
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func query[T any](t *testing.T, conn *pgx.Conn, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// ids returns the first column of every event of table seen so far.
func (s *memSink) ids(table string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, ev := range s.events {
		if ev.Table.Name == table && ev.Image() != nil {
			out[string(ev.Image()[0].Text)] = true
		}
	}
	return out
}

func TestHeartbeatAdvancesSlotWhileCapturedTablesIdle(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn,
		"CREATE TABLE captured (id int PRIMARY KEY)", "ALTER TABLE captured REPLICA IDENTITY FULL",
		"CREATE TABLE busy (id serial PRIMARY KEY, pad text)")
	follow(t, dsn, &memSink{}, "captured")
	conn := pgtest.Connect(t, dsn)
	pgtest.Exec(t, dsn, "INSERT INTO busy (pad) SELECT repeat('x', 500) FROM generate_series(1, 20000)")
	end := query[string](t, conn, "SELECT pg_current_wal_lsn()::text")
	waitFor(t, "confirmed_flush_lsn to pass the busy table's writes", func() bool {
		return query[bool](t, conn, "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 's'", end)
	})
}

func TestReconnectsWhenPostgresRestarts(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn, "CREATE TABLE t (id int PRIMARY KEY)", "ALTER TABLE t REPLICA IDENTITY FULL")
	sink := &memSink{}
	r := follow(t, dsn, sink, "t")
	pgtest.Exec(t, dsn, "INSERT INTO t SELECT generate_series(1, 10)")
	waitFor(t, "the first rows", func() bool { return len(sink.ids("t")) == 10 })
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, dsn, "INSERT INTO t SELECT generate_series(11, 20)")
	waitFor(t, "rows written after the restart", func() bool { return len(sink.ids("t")) == 20 })
	select {
	case <-r.done:
		t.Fatalf("source stopped: %v", r.err)
	default:
	}
}

func TestSchemaChanges(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn, "CREATE TABLE t (id int PRIMARY KEY, a text)", "ALTER TABLE t REPLICA IDENTITY FULL")
	sink := &memSink{}
	r := follow(t, dsn, sink, "t")

	// Additive: the new schema is recorded before the first event using it.
	pgtest.Exec(t, dsn, "ALTER TABLE t ADD COLUMN b numeric(10,2) DEFAULT 7", "INSERT INTO t VALUES (1, 'x', 1.5)")
	waitFor(t, "the insert after ADD COLUMN", func() bool { return sink.ids("t")["1"] })
	sink.mu.Lock()
	last := sink.schemas[len(sink.schemas)-1]
	ev := sink.events[len(sink.events)-1]
	sink.mu.Unlock()
	if len(last.Columns) != 3 || last.Columns[2].Type.Precision != 10 || len(ev.After) != 3 || string(ev.After[2].Text) != "1.50" {
		t.Fatalf("after ADD COLUMN: schema %+v, event %d values", last.Columns, len(ev.After))
	}

	// Breaking: the table is parked before the change that needs the new
	// layout, and the slot does not move past it, though heartbeats go on.
	pgtest.Exec(t, dsn, "ALTER TABLE t DROP COLUMN a", "INSERT INTO t VALUES (2, 2.5)")
	r.parks(t, "column a was dropped")
	at := r.src.Parked()[0].At.Seq
	waitFor(t, "heartbeats after the park", func() bool { return sink.Durable() > at })
	time.Sleep(time.Second) // the stream confirms every second
	if sink.ids("t")["2"] {
		t.Fatal("the change after the breaking change was delivered")
	}
	conn := pgtest.Connect(t, dsn)
	if confirmed := query[string](t, conn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'"); query[bool](t, conn, "SELECT $1::pg_lsn >= $2::pg_lsn", confirmed, at.String()) {
		t.Fatalf("the slot is confirmed to %s, past the parked change at %s", confirmed, at)
	}
}

func TestPreflightSaysWhatToRun(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn,
		"CREATE TABLE nokey (a int)", "ALTER TABLE nokey REPLICA IDENTITY FULL",
		"CREATE TABLE partial (id int PRIMARY KEY)", "ALTER TABLE partial REPLICA IDENTITY NOTHING",
		"CREATE TABLE byindex (id int PRIMARY KEY, code int NOT NULL UNIQUE)", "ALTER TABLE byindex REPLICA IDENTITY USING INDEX byindex_code_key",
		"CREATE TABLE plain (id int PRIMARY KEY)",
		"DROP ROLE IF EXISTS reader", "CREATE ROLE reader LOGIN PASSWORD 'pw'")
	err := drain(t, dsn, &memSink{}, "nokey", "partial", "byindex", "plain", "missing", "plian")
	for _, want := range []string{
		"table public.nokey has no primary key",
		"table public.partial has REPLICA IDENTITY NOTHING, so its updates and deletes do not say which row they change: run ALTER TABLE public.partial REPLICA IDENTITY DEFAULT;",
		"table public.byindex has a REPLICA IDENTITY USING INDEX other than its primary key, which silver merges on: run ALTER TABLE public.byindex REPLICA IDENTITY DEFAULT;",
		"table public.missing does not exist in the source (check source.tables",
		"table public.plian does not exist in the source (did you mean public.plain?)",
	} {
		if !errors.Is(err, fault.ErrSource) || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
	if strings.Contains(strings.ReplaceAll(fmt.Sprint(err), "did you mean public.plain", ""), "plain") {
		t.Errorf("error %v names public.plain, whose identity (DEFAULT, as PostgreSQL creates it) is fine", err)
	}
	cfg, _ := pgx.ParseConfig(dsn)
	readerDSN := fmt.Sprintf("postgres://reader:pw@%s:%d/%s?sslmode=disable", cfg.Host, cfg.Port, cfg.Database)
	pgtest.Exec(t, dsn, "CREATE TABLE ok (id int PRIMARY KEY)")
	err = drain(t, readerDSN, &memSink{}, "ok")
	if !errors.Is(err, fault.ErrSource) || !strings.Contains(err.Error(), `run ALTER ROLE "reader" REPLICATION`) {
		t.Errorf("want the replication privilege named, got %v", err)
	}
}

// TestChangesThatRewriteValuesPark: a change that gives existing rows
// values no event carries, or that changes values, parks the table before
// the first change of the new shape, naming what happened.
func TestChangesThatRewriteValuesPark(t *testing.T) {
	for name, tc := range map[string]struct {
		ddl  string
		want string
	}{
		"volatile default": {"ALTER TABLE t ADD COLUMN r float8 DEFAULT random()", "rewrote the table"},
		"identity column":  {"ALTER TABLE t ADD COLUMN n int GENERATED ALWAYS AS IDENTITY", "an identity"},
		"retype":           {"ALTER TABLE t ALTER COLUMN a TYPE text USING a::text", "changed type from integer to text"},
		"narrowing":        {"ALTER TABLE t ALTER COLUMN c TYPE varchar(2)", "narrowed from character varying(10) to character varying(2)"},
	} {
		t.Run(name, func(t *testing.T) {
			dsn := pg.NewDatabase(t)
			pgtest.Exec(t, dsn, "CREATE TABLE t (id int PRIMARY KEY, a int, c varchar(10))", "ALTER TABLE t REPLICA IDENTITY FULL",
				"INSERT INTO t VALUES (1, 1, 'x')")
			sink := &memSink{}
			r := follow(t, dsn, sink, "t")
			pgtest.Exec(t, dsn, tc.ddl, "INSERT INTO t (id) VALUES (2)")
			r.parks(t, tc.want)
			if sink.ids("t")["2"] {
				t.Fatal("the change after it was delivered")
			}
		})
	}
}
