package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestCopyLeavesChangedRowsToTheStream: a table added after the snapshot
// is copied in chunks while the stream runs; rows changed between a
// chunk's read and its high watermark (the hook makes the changes there)
// are left to the stream's events, which are newer, so the events, in
// order, leave exactly the source's rows: no stale value, no deleted row
// brought back, none missing.
func TestCopyLeavesChangedRowsToTheStream(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn, "CREATE TABLE a (id int PRIMARY KEY)")
	sink := &memSink{}
	if err := drain(t, dsn, sink, "a"); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, dsn, "CREATE TABLE b (id int PRIMARY KEY, v int)", "INSERT INTO b SELECT g, g FROM generate_series(1, 20000) g")
	chunks := 0
	defer postgres.OnChunkRead(func(table string) error {
		chunks++
		if chunks == 1 {
			// Inside the chunk just read, and after it.
			pgtest.Exec(t, dsn, "UPDATE b SET v = -5 WHERE id = 5", "DELETE FROM b WHERE id = 6", "INSERT INTO b VALUES (20001, 1)",
				"UPDATE b SET v = -15000 WHERE id = 15000", "DELETE FROM b WHERE id = 15001")
		}
		return nil
	})()
	if err := drain(t, dsn, sink, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 {
		t.Fatalf("b was copied in %d chunks, want 3 or more", chunks)
	}
	rows := map[string]string{}
	copied := 0
	for _, ev := range sink.events {
		if ev.Table.Name != "b" {
			continue
		}
		switch ev.Op {
		case change.OpDelete:
			delete(rows, string(ev.Before[0].Text))
		case change.OpRead:
			copied++
			if ev.Snapshot != change.SnapshotIncremental {
				t.Fatalf("a copied row is marked snapshot %q, want incremental", ev.Snapshot)
			}
			fallthrough
		default:
			rows[string(ev.After[0].Text)] = string(ev.After[1].Text)
		}
	}
	conn := pgtest.Connect(t, dsn)
	defer conn.Close(context.Background())
	var n int
	var sum int64
	if err := conn.QueryRow(context.Background(), "SELECT count(*), sum(v) FROM b").Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	var got int64
	for _, v := range rows {
		var x int64
		fmt.Sscan(v, &x)
		got += x
	}
	if len(rows) != n || got != sum || rows["5"] != "-5" || rows["6"] != "" || rows["15000"] != "-15000" || rows["15001"] != "" {
		t.Fatalf("the events leave %d rows summing to %d (5: %q, 6: %q, 15000: %q), the source has %d summing to %d",
			len(rows), got, rows["5"], rows["6"], rows["15000"], n, sum)
	}
	if copied >= 20000 {
		t.Errorf("%d rows copied: the rows changed in the chunk's window were copied too", copied)
	}
}

// TestCopyThatFailsNamesTheWayPast: a copy whose read fails for a reason
// a restart does not change (here: one the hook makes) stops every run the
// same way, saying so; taking the table out of source.tables gets past it,
// and the other tables go on.
func TestCopyThatFailsNamesTheWayPast(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn, "CREATE TABLE a (id int PRIMARY KEY)")
	sink := &memSink{}
	if err := drain(t, dsn, sink, "a"); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, dsn, "CREATE TABLE b (id int PRIMARY KEY)", "INSERT INTO b VALUES (1)")
	defer postgres.OnChunkRead(func(string) error {
		return &pgconn.PgError{Code: "42501", Message: "permission denied for table b"}
	})()
	for range 2 {
		err := drain(t, dsn, sink, "a", "b")
		if !errors.Is(err, fault.ErrSource) || !strings.Contains(err.Error(), "permission denied for table b") ||
			!strings.Contains(err.Error(), "taken out of source.tables") {
			t.Fatalf("a copy that cannot read b: %v, want a stop naming the cause and the way past", err)
		}
	}
	pgtest.Exec(t, dsn, "INSERT INTO a VALUES (7)")
	if err := drain(t, dsn, sink, "a"); err != nil {
		t.Fatalf("with b taken out of source.tables: %v", err)
	}
	if len(sink.state.Copies) != 0 || !sink.ids("a")["7"] {
		t.Fatalf("copies %v left, a's change delivered %v: the run did not go on", sink.state.Copies, sink.ids("a")["7"])
	}
}
