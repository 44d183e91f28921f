package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestReceiveBufferIsBoundedInBytes: a transaction of large rows waits in
// PostgreSQL while the sink is slow; lakeflow holds no more than its
// buffer's worth of it.
func TestReceiveBufferIsBoundedInBytes(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn, "CREATE TABLE big (id int PRIMARY KEY, v text)", "ALTER TABLE big REPLICA IDENTITY FULL",
		"ALTER TABLE big ALTER COLUMN v SET STORAGE EXTERNAL") // no compression: every row is 512 KiB on the wire
	sink := &memSink{}
	if err := drain(t, dsn, sink, "big"); err != nil { // the snapshot
		t.Fatal(err)
	}
	sink.delay = 20 * time.Millisecond
	pgtest.Exec(t, dsn, `INSERT INTO big SELECT g, (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 16384) i)
		FROM generate_series(1, 40) g`)
	const limit = 4 << 20
	src := postgres.NewSource(sourceConfig(postgres.SourceConfig{DSN: dsn, BufferBytes: limit}, []string{"big"}), quiet())
	done := make(chan struct{})
	close(done)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := src.Run(ctx, sink, sink, done); err != nil {
		t.Fatal(err)
	}
	if n := len(sink.ids("big")); n != 40 {
		t.Fatalf("got %d rows, want 40", n)
	}
	if peak := src.Stats.BufferedPeak.Load(); peak > limit+(1<<20) {
		t.Fatalf("the source held %d bytes of WAL at once, beyond its %d-byte buffer", peak, limit)
	}
}

// TestSlotInUseElsewhereEndsTheRun: a slot another process streams from
// is not retried forever; the error names the slot.
func TestSlotInUseElsewhereEndsTheRun(t *testing.T) {
	defer postgres.SetSlotBusyTimeout(2 * time.Second)()
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn, "CREATE TABLE t (id int PRIMARY KEY)", "ALTER TABLE t REPLICA IDENTITY FULL")
	sink := &memSink{}
	if err := drain(t, dsn, sink, "t"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	other, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if err := pglogrepl.StartReplication(ctx, other, "s", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'p'"}}); err != nil {
		t.Fatal(err)
	}
	err = drain(t, dsn, sink, "t")
	if !errors.Is(err, fault.ErrSource) || !strings.Contains(err.Error(), "replication slot s is in use by another process") {
		t.Fatalf("want the slot named as in use, got %v", err)
	}
}

// TestBadCredentialsEndTheRun: when the stream's connection is lost and
// the server then refuses the role's password, the run ends with the
// server's reason instead of reconnecting forever.
func TestBadCredentialsEndTheRun(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn, "CREATE TABLE t (id int PRIMARY KEY)", "ALTER TABLE t REPLICA IDENTITY FULL",
		"DROP ROLE IF EXISTS mover", "CREATE ROLE mover LOGIN REPLICATION PASSWORD 'pw'", "GRANT SELECT ON t TO mover",
		"CREATE PUBLICATION p FOR TABLE t WITH (publish_via_partition_root = true)")
	cfg, _ := pgx.ParseConfig(dsn)
	moverDSN := fmt.Sprintf("postgres://mover:pw@%s:%d/%s?sslmode=disable", cfg.Host, cfg.Port, cfg.Database)
	r := followWith(t, postgres.SourceConfig{DSN: moverDSN, Heartbeat: 100 * time.Millisecond}, &memSink{}, "t")
	pgtest.Exec(t, dsn, "ALTER ROLE mover PASSWORD 'changed'",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'mover'")
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the source kept reconnecting with a password the server refuses")
	}
	if !errors.Is(r.err, fault.ErrSource) || !strings.Contains(r.err.Error(), "password authentication failed") {
		t.Fatalf("want the authentication failure named, got %v", r.err)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestClusterPortInUse: a port another process holds is named as the
// setting to change, not answered with the server's log.
func TestClusterPortInUse(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port
	dir := pgtest.ReachableDir(t, "lakeflow-port-")
	c, err := postgres.StartCluster(context.Background(), postgres.ClusterConfig{Dir: filepath.Join(dir, "pg"), Port: port, Ephemeral: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil {
		c.Stop()
		t.Fatal("the cluster started on a port another process holds")
	}
	want := fmt.Sprintf("source.port %d is already in use", port)
	if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "postgres.log") {
		t.Fatalf("got %q, want one line saying %q", err, want)
	}
}
