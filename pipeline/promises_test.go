package pipeline

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// Promises the manual (README, docs/) makes that no other test holds it to.

// writeContract writes the contract of public.t: its columns (name,
// type pairs) and extra lines.
func writeContract(t *testing.T, h *harness, extra string, cols ...string) {
	t.Helper()
	body := "table = \"public.t\"\nkey = [\"id\"]\n" + extra + "\n"
	for i := 0; i < len(cols); i += 2 {
		body += "[[columns]]\nname = \"" + cols[i] + "\"\ntype = \"" + cols[i+1] + "\"\n"
	}
	if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, "t.toml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// stopsWith runs the pipeline over steps and wants a stop for a schema
// change (exit 4) whose message holds each of wants.
func stopsWith(t *testing.T, h *harness, steps []string, wants ...string) {
	t.Helper()
	err := runWatched(t, h.cfg, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{steps, {`UPDATE t SET id = id WHERE id = 1`}})
	}}, h.log)
	if !errors.Is(err, fault.ErrSchemaBreak) {
		t.Fatalf("want a breaking schema change, got %v", err)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("the stop does not say %q: %v", w, err)
		}
	}
}

// TestCompatibilityForwardAndFull: under compatibility forward a widened
// column stops the run until the contract lists it, and a narrowed one
// goes through; under full both stop until listed.
func TestCompatibilityForwardAndFull(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, a int, b varchar(10))`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g, 'b' || g FROM generate_series(1, 5) g`)
	writeContract(t, h, `compatibility = "forward"`, "id", "integer", "a", "integer", "b", "character varying(10)")
	h.run(t, Options{})
	stopsWith(t, h, []string{`ALTER TABLE t ALTER COLUMN a TYPE bigint`}, "compatibility forward", `set type = "bigint" for column "a"`)
	writeContract(t, h, `compatibility = "forward"`, "id", "integer", "a", "bigint", "b", "character varying(10)")
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `ALTER TABLE t ALTER COLUMN b TYPE varchar(5)`, `UPDATE t SET b = 'x' WHERE id = 2`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")

	writeContract(t, h, `compatibility = "full"`, "id", "integer", "a", "bigint", "b", "character varying(5)")
	stopsWith(t, h, []string{`ALTER TABLE t ALTER COLUMN b TYPE varchar(8)`}, "compatibility full", `set type = "character varying(8)" for column "b"`)
	writeContract(t, h, `compatibility = "full"`, "id", "integer", "a", "bigint", "b", "character varying(8)")
	h.run(t, Options{})
	stopsWith(t, h, []string{`ALTER TABLE t ALTER COLUMN b TYPE varchar(6)`}, `set type = "character varying(6)" for column "b"`)
	writeContract(t, h, `compatibility = "full"`, "id", "integer", "a", "bigint", "b", "character varying(6)")
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
}

// TestNewPrimaryKeyStops: a table whose primary key changes stops the
// run (exit 4) under any compatibility mode: its history is keyed by the
// old key.
func TestNewPrimaryKeyStops(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, a int NOT NULL)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g FROM generate_series(1, 5) g`)
	writeContract(t, h, `compatibility = "none"`, "id", "integer", "a", "integer")
	h.run(t, Options{})
	stopsWith(t, h, []string{`ALTER TABLE t DROP CONSTRAINT t_pkey`, `ALTER TABLE t ADD PRIMARY KEY (id, a)`}, "primary key")
}

// TestKafkaLostWhileTheWarehouseIsBehind: the pipeline dies with events
// in Kafka that the warehouse has not applied, and the Kafka data is
// lost. The slot was confirmed only up to what the warehouse applied: the
// WAL still holds the rest, and the next run loses nothing.
func TestKafkaLostWhileTheWarehouseIsBehind(t *testing.T) {
	bin := lakeflowFaultBinary(t)
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g FROM generate_series(1, 50) g`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `UPDATE t SET v = -v WHERE id <= 25`, `INSERT INTO t VALUES (51, 51)`, `DELETE FROM t WHERE id = 50`)
	// Dies in its first batch: the changes are in Kafka, not applied.
	out, err := lakeflowCmdAt(t, bin, crash.Rules, "--config", h.file, "run").CombinedOutput()
	if !diedAt(err, out, crash.Rules) {
		t.Fatalf("lakeflow run did not die at %s: %v\n%s", crash.Rules, err, out)
	}
	if err := os.RemoveAll(h.cfg.Kafka.Dir); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	assertLakeMatchesSilver(t, h.cfg, "t")
}

// TestAsOfWhileABatchIsHalfPublished: a batch's lake files reach their
// names one by one (a crash between the renames leaves it half
// published): asof answers as of the last position whose batches the
// lake holds whole, and says so.
func TestAsOfWhileABatchIsHalfPublished(t *testing.T) {
	h := newHarness(t, "public.t", "public.u")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`CREATE TABLE u (id int PRIMARY KEY, v int)`, `ALTER TABLE u REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g FROM generate_series(1, 10) g`, `INSERT INTO u SELECT g, g FROM generate_series(1, 10) g`)
	h.run(t, Options{})
	// One transaction: its batch writes a file for each table.
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{{`UPDATE t SET v = 0`, `UPDATE u SET v = 0`}})
	}})
	// The last batch's file of u goes back to its staging name.
	path := queryText(t, h.cfg.Warehouse.Path, "SELECT path FROM lakeflow.lake_files WHERE source_table = 'public.u' ORDER BY batch DESC LIMIT 1")
	staged := filepath.Join(h.cfg.Lake.Dir, "_staging", strings.ReplaceAll(path, string(filepath.Separator), "~")+".staging")
	if err := os.Rename(filepath.Join(h.cfg.Lake.Dir, path), staged); err != nil {
		t.Fatal(err)
	}
	a, out := asofAtEnd(t, h)
	if !a.Held {
		t.Error("asof does not say a batch is half published")
	}
	for _, table := range []string{"t", "u"} {
		if n := queryText(t, out, "SELECT count(*) FROM silver."+table+" WHERE v = 0"); n != "0" {
			t.Errorf("asof holds %s rows of %s from the half published batch", n, table)
		}
	}
}
