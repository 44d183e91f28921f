package pipeline

import (
	"context"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// realDDL is a source lakeflow did not create: names as PostgreSQL stores
// them (mixed case, spaces, reserved words, non-ASCII, a dot), a stored
// generated column, a partitioned table, and a table whose types widen
// while changes flow.
const realDDL = `
CREATE TABLE "MixedCase_Table" ("Id" int PRIMARY KEY, "Value" text);
CREATE TABLE "Big Accounts" ("account id" bigint PRIMARY KEY, "group" text, "select" int, "order" numeric(10,2), "prix €" text);
CREATE TABLE café ("clé" int PRIMARY KEY, "naïve" text);
CREATE SCHEMA sales;
CREATE TABLE sales."a.b" (id int PRIMARY KEY, v text);
CREATE TABLE gen (id int PRIMARY KEY, price int, qty int, total int GENERATED ALWAYS AS (price * qty) STORED, note text);
CREATE TABLE measures (id int, month int, v text, PRIMARY KEY (id, month)) PARTITION BY LIST (month);
CREATE TABLE measures_1 PARTITION OF measures FOR VALUES IN (1);
CREATE TABLE measures_2 PARTITION OF measures FOR VALUES IN (2);
CREATE TABLE widen (id smallint PRIMARY KEY, a smallint, b integer, c varchar(5), d numeric(6,2), e real, f text NOT NULL,
	g int[][], h text[][]);
ALTER TABLE "MixedCase_Table" REPLICA IDENTITY FULL;
ALTER TABLE "Big Accounts" REPLICA IDENTITY FULL;
ALTER TABLE café REPLICA IDENTITY FULL;
ALTER TABLE sales."a.b" REPLICA IDENTITY FULL;
ALTER TABLE gen REPLICA IDENTITY FULL;
ALTER TABLE measures_1 REPLICA IDENTITY FULL;
ALTER TABLE measures_2 REPLICA IDENTITY FULL;
ALTER TABLE widen REPLICA IDENTITY FULL;
INSERT INTO "MixedCase_Table" VALUES (1, 'one'), (2, 'two');
INSERT INTO "Big Accounts" VALUES (1, 'g', 1, 1.50, '€1'), (2, NULL, NULL, NULL, NULL);
INSERT INTO café VALUES (1, 'crème');
INSERT INTO sales."a.b" VALUES (1, 'dot');
INSERT INTO gen (id, price, qty) VALUES (1, 2, 3), (2, 5, 5);
INSERT INTO measures VALUES (1, 1, 'a'), (2, 1, 'b'), (3, 2, 'c');
INSERT INTO widen VALUES (1, 1, 1, 'abc', 1.25, 1.1, 'x', '{{1,2},{3,NULL}}', '{{"a b",NULL},{"c","d"}}'),
	(2, -32768, 2147483647, NULL, -9999.99, 3.4e38, 'y', '{}', NULL);
`

var realTables = []string{"public.MixedCase_Table", "public.Big Accounts", "public.café", `sales."a.b"`, "public.gen", "public.measures", "public.widen"}

// realChanges alter and change the tables while the stream runs.
var realChanges = [][]string{
	{`UPDATE "MixedCase_Table" SET "Value" = 'ONE' WHERE "Id" = 1`, `INSERT INTO "MixedCase_Table" VALUES (3, 'three')`, `DELETE FROM "MixedCase_Table" WHERE "Id" = 2`},
	{`UPDATE "Big Accounts" SET "group" = 'select', "select" = 7, "order" = 99.99, "prix €" = '€ 2' WHERE "account id" = 1`,
		`INSERT INTO "Big Accounts" VALUES (3, 'order', 3, 0.01, 'ü')`},
	{`UPDATE café SET "naïve" = 'brûlée' WHERE "clé" = 1`, `INSERT INTO café VALUES (2, 'ça')`},
	{`UPDATE sales."a.b" SET v = 'dotted' WHERE id = 1`, `INSERT INTO sales."a.b" VALUES (2, 'two')`},
	{`UPDATE gen SET qty = 10, note = 'ten' WHERE id = 1`, `INSERT INTO gen (id, price, qty) VALUES (3, 7, 7)`, `DELETE FROM gen WHERE id = 2`},
	// Rows move between partitions (their key includes the partition key).
	{`UPDATE measures SET month = 2, v = 'moved' WHERE id = 1`, `UPDATE measures SET v = 'b2' WHERE id = 2`, `INSERT INTO measures VALUES (4, 2, 'd')`},
	// A partition created later, without REPLICA IDENTITY FULL.
	{`CREATE TABLE measures_3 PARTITION OF measures FOR VALUES IN (3)`, `INSERT INTO measures VALUES (5, 3, 'e'), (6, 3, 'f')`},
	{`UPDATE measures SET v = 'e2' WHERE id = 5`, `DELETE FROM measures WHERE id = 6`, `UPDATE measures SET month = 3 WHERE id = 3`},
	// Widening type changes, each followed by changes.
	{`ALTER TABLE widen ALTER COLUMN a TYPE integer`, `UPDATE widen SET a = 100000 WHERE id = 1`},
	{`ALTER TABLE widen ALTER COLUMN b TYPE bigint`, `INSERT INTO widen VALUES (3, 3, 9000000000, 'x', 1, 1, 'z', '{{5}}', '{{"e"}}')`},
	{`ALTER TABLE widen ALTER COLUMN id TYPE integer`, `INSERT INTO widen VALUES (40000, 4, 4, 'y', 2, 2, 'w', NULL, NULL)`},
	{`ALTER TABLE widen ALTER COLUMN c TYPE varchar(20)`, `UPDATE widen SET c = 'twenty characters!!' WHERE id = 1`},
	{`ALTER TABLE widen ALTER COLUMN c TYPE text`, `ALTER TABLE widen ALTER COLUMN d TYPE numeric(10,2)`, `UPDATE widen SET c = repeat('long', 20), d = 12345678.91 WHERE id = 2`},
	{`ALTER TABLE widen ALTER COLUMN e TYPE double precision`, `UPDATE widen SET e = 1e300 WHERE id = 3`},
	{`ALTER TABLE widen ALTER COLUMN f DROP NOT NULL`, `UPDATE widen SET f = NULL WHERE id = 3`},
	// Added columns whose existing rows get a value without any event.
	{`ALTER TABLE widen ADD COLUMN k text NOT NULL DEFAULT 'x'`, `ALTER TABLE widen ADD COLUMN t timestamptz DEFAULT now()`,
		`ALTER TABLE widen ADD COLUMN n int`, `ALTER TABLE widen ALTER COLUMN n SET DEFAULT 5`,
		`UPDATE widen SET k = 'changed' WHERE id = 2`, `INSERT INTO widen (id, f) VALUES (5, 'after')`},
	{`UPDATE widen SET a = a + 1`},
}

// TestRealDatabase captures tables lakeflow did not create, through a
// snapshot and changes that include DDL, and compares every silver table
// with its source column by column.
func TestRealDatabase(t *testing.T) {
	h := newHarness(t, realTables...)
	pgtest.Exec(t, h.dsn, realDDL)
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error { return applySteps(ctx, dsn, realChanges) }})
	// A restart, and more changes in every partition.
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{{`UPDATE measures SET v = v || '!'`, `INSERT INTO measures VALUES (7, 1, 'g'), (8, 3, 'h')`,
			`UPDATE widen SET c = 'again' WHERE id = 1`, `INSERT INTO "Big Accounts" VALUES (4, 'group', 4, 4.44, '€4')`}})
	}})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, realTables...)
	assertSilverTypes(t, h.cfg.Warehouse.Path, "widen", `id INTEGER, a INTEGER, b BIGINT, c VARCHAR, d DECIMAL(10,2), e DOUBLE, f VARCHAR,
		g INTEGER[][], h VARCHAR[][], _cdc_seq UBIGINT, _cdc_ord UINTEGER, _commit_ts TIMESTAMP WITH TIME ZONE, _deleted BOOLEAN,
		k VARCHAR, t TIMESTAMP WITH TIME ZONE, n INTEGER`)
	assertLakeExactlyOnce(t, h.cfg, realTables...)
	// A partition move is a delete of the old key and an insert of the
	// new: no ghost of the old row stays live.
	db := openDuck(t, h.cfg.Warehouse.Path)
	defer db.Close()
	var live int
	queryRow(t, db, `SELECT count(*) FROM silver.measures WHERE id = 1 AND NOT _deleted`, &live)
	if live != 1 {
		t.Fatalf("measures id 1 has %d live rows after moving partitions, want 1", live)
	}
	var topics string
	queryRow(t, db, `SELECT string_agg(topic, ' ' ORDER BY topic) FROM lakeflow.tables`, &topics)
	for _, want := range []string{"lakeflow.public.Big_Accounts", "lakeflow.public.caf_", "lakeflow.sales.a_b", "lakeflow.public.MixedCase_Table"} {
		if !strings.Contains(topics, want) {
			t.Errorf("topics %q lack %s", topics, want)
		}
	}
}
