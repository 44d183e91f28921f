package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/config"
	"github.com/lakeflow/lakeflow/pipeline/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// These tests hold lakeflow to DESIGN.md's "nothing wedges it": a record
// that reaches it is applied, dead-lettered, or stops the run with a
// command that gets past it, and the test runs that command.

// TestDroppedTableWhileBehind: a captured table is dropped while its
// last changes wait in the WAL. The WAL describes it as it was, the
// catalog no longer has it: its changes still reach silver, the other
// tables' too, and the runs after go on. Taken out of source.tables, a
// table is no longer captured (its changes still in the WAL are
// skipped), and that stops nothing either.
func TestDroppedTableWhileBehind(t *testing.T) {
	h := newHarness(t, "public.a", "public.b", "public.c")
	pgtest.Exec(t, h.dsn, `CREATE TABLE a (id int PRIMARY KEY, v int)`, `CREATE TABLE b (id int PRIMARY KEY, v int)`,
		`CREATE TABLE c (id int PRIMARY KEY, v int)`,
		`ALTER TABLE a REPLICA IDENTITY FULL`, `ALTER TABLE b REPLICA IDENTITY FULL`, `ALTER TABLE c REPLICA IDENTITY FULL`,
		`INSERT INTO a VALUES (1, 1)`, `INSERT INTO b VALUES (1, 1)`, `INSERT INTO c VALUES (1, 1)`)
	h.run(t, Options{})
	// b stays in source.tables: its changes are applied, and a warning
	// says it is gone.
	pgtest.Exec(t, h.dsn, `INSERT INTO b VALUES (2, 2)`, `INSERT INTO a VALUES (2, 2)`, `DROP TABLE b`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a", "public.c")
	rows := func(table string) string {
		return queryText(t, h.cfg.Warehouse.Path, "SELECT string_agg(id || ':' || v, ',' ORDER BY id) FROM silver."+table+" WHERE NOT _deleted")
	}
	if got := rows("b"); got != "1:1,2:2" {
		t.Errorf("silver.b holds %s, want the rows b had when it was dropped (1:1,2:2)", got)
	}
	if !strings.Contains(h.logs.String(), "no longer exists in the source") {
		t.Errorf("no warning says public.b is gone from the source")
	}
	// c is dropped and taken out of source.tables before its last
	// changes are read.
	pgtest.Exec(t, h.dsn, `UPDATE c SET v = 10`, `INSERT INTO a VALUES (3, 3)`, `DROP TABLE c`)
	h.cfg.Source.Tables = []config.Table{{Schema: "public", Name: "a"}, {Schema: "public", Name: "b"}}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a")
	if got := rows("c"); got != "1:1" {
		t.Errorf("silver.c holds %s; taken out of source.tables, it keeps what it had (1:1)", got)
	}
	h.cfg.Source.Tables = h.cfg.Source.Tables[:1]
	pgtest.Exec(t, h.dsn, `INSERT INTO a VALUES (4, 4)`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a")
	assertLakeExactlyOnce(t, h.cfg, "public.a", "public.b", "public.c")
}

// TestDroppedTypeWhileBehind: a column and its enum type are dropped
// while changes made with it wait in the WAL. The type is decoded as the
// schema history knows it; the drop then stops the run under the
// contract (no contract: backward), and the command the stop names gets
// past it.
func TestDroppedTypeWhileBehind(t *testing.T) {
	h := newHarness(t, "public.c")
	pgtest.Exec(t, h.dsn, `CREATE TYPE st AS ENUM ('x', 'y')`, `CREATE TABLE c (id int PRIMARY KEY, s st, v int)`,
		`ALTER TABLE c REPLICA IDENTITY FULL`, `INSERT INTO c VALUES (1, 'x', 1)`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `INSERT INTO c VALUES (2, 'y', 2)`, `ALTER TABLE c DROP COLUMN s`, `DROP TYPE st`, `INSERT INTO c VALUES (3, 3)`)
	err := runWatched(t, h.cfg, Options{}, h.log)
	if !errors.Is(err, fault.ErrSchemaBreak) || !strings.Contains(err.Error(), "column s was dropped") || !strings.Contains(err.Error(), "lakeflow contracts init") {
		t.Fatalf("want a stop at the dropped column that names the command past it, got %v", err)
	}
	if _, err := InitContracts(context.Background(), h.cfg, "", h.log); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.c")
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT string_agg(id || ':' || coalesce(s, '-'), ',' ORDER BY id) FROM silver.c"); got != "1:x,2:y,3:-" {
		t.Errorf("silver.c's dropped column s holds %s, want 1:x,2:y,3:-", got)
	}
}

// TestDefaultColumnOnAPartitionedTable: a column added with a constant
// DEFAULT to a partitioned table, then a partition created: the new
// partition has no stored default (it has no old rows), which is no
// table rewrite.
func TestDefaultColumnOnAPartitionedTable(t *testing.T) {
	h := newHarness(t, "public.m")
	pgtest.Exec(t, h.dsn, `CREATE TABLE m (id int, day date, v int, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)`,
		`CREATE TABLE m_1 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')`,
		`ALTER TABLE m_1 REPLICA IDENTITY FULL`, `INSERT INTO m VALUES (1, '2024-01-05', 1)`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `ALTER TABLE m ADD COLUMN x int DEFAULT 5`,
		`CREATE TABLE m_2 PARTITION OF m FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')`,
		`INSERT INTO m VALUES (2, '2024-02-05', 2)`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.m")
}

// TestWideningKeepsPostgreSQLsValues: a real column widened to double
// precision while changes made before it wait in Kafka: silver, asof and
// a backfill hold what PostgreSQL's own conversion gives (float4 to
// float8 is exact), not the float4's shortest text read as a double.
func TestWideningKeepsPostgreSQLsValues(t *testing.T) {
	h := newHarness(t, "public.f")
	pgtest.Exec(t, h.dsn, `CREATE TABLE f (id int PRIMARY KEY, r real, s smallint, n numeric(6,2))`, `ALTER TABLE f REPLICA IDENTITY FULL`,
		`INSERT INTO f VALUES (1, 1.0/3, 1, 1.25)`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `INSERT INTO f VALUES (2, 2.0/3, 2, 2.5)`, `UPDATE f SET r = 0.1 WHERE id = 1`,
		`ALTER TABLE f ALTER COLUMN r TYPE double precision`, `ALTER TABLE f ALTER COLUMN s TYPE bigint`,
		`ALTER TABLE f ALTER COLUMN n TYPE numeric(12,2)`, `INSERT INTO f VALUES (3, 1.0/3, 3, 3.75)`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.f")
	assertAsOfEqualsSource(t, h, "public.f")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "f")
}
