package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestSchemaChangesUnderTheContract: a dropped, a renamed and a retyped
// column, each while changes flow, stop ingestion with exit code 4 and
// the contract change that accepts it; after that change lakeflow goes on
// with nothing lost. A retype silver cannot follow is refused, clearly.
func TestSchemaChangesUnderTheContract(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, a text, b int, c varchar(10), d text)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, 'a' || g, g, (g * 10)::text, 'd' || g FROM generate_series(1, 20) g`)
	contract := func(columns string) {
		t.Helper()
		body := "table = \"public.t\"\nkey = [\"id\"]\n[[rules]]\nname = \"b_small\"\ncheck = \"id < 1000\"\n" + columns
		if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, "t.toml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	col := func(name, typ string, extra ...string) string {
		return "[[columns]]\nname = \"" + name + "\"\ntype = \"" + typ + "\"\n" + strings.Join(extra, "\n") + "\n"
	}
	contract(col("id", "integer") + col("a", "text") + col("b", "integer") + col("c", "character varying(10)") + col("d", "text"))
	h.run(t, Options{})
	stops := func(step []string, wants ...string) {
		t.Helper()
		err := runWatched(t, h.cfg, Options{Workload: func(ctx context.Context, dsn string) error {
			return applySteps(ctx, dsn, [][]string{step, {`UPDATE t SET id = id WHERE id = 1`}})
		}}, h.log)
		if !errors.Is(err, fault.ErrSchemaBreak) {
			t.Fatalf("want a breaking schema change, got %v", err)
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("the error does not say %q: %v", w, err)
			}
		}
	}
	// Dropped: stop, then the contract no longer lists it.
	stops([]string{`ALTER TABLE t DROP COLUMN a`, `INSERT INTO t (id, b, c, d) VALUES (21, 21, '210', 'd21')`},
		"table public.t: column a was dropped", `remove the [[columns]] entry "a"`)
	contract(col("id", "integer") + col("b", "integer") + col("c", "character varying(10)") + col("d", "text"))
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	// Renamed.
	stops([]string{`ALTER TABLE t RENAME COLUMN b TO bb`, `UPDATE t SET bb = bb + 100 WHERE id <= 5`},
		"column b was renamed to bb", `name = "bb" with renamed_from = "b"`)
	contract(col("id", "integer") + col("bb", "integer", `renamed_from = "b"`) + col("c", "character varying(10)") + col("d", "text"))
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	// Retyped, every stored value converts.
	stops([]string{`ALTER TABLE t ALTER COLUMN c TYPE integer USING c::integer`, `INSERT INTO t (id, bb, c, d) VALUES (22, 22, 220, 'd22')`},
		"column c changed type from character varying(10) to integer", `set type = "integer" for column "c"`)
	contract(col("id", "integer") + col("bb", "integer", `renamed_from = "b"`) + col("c", "integer") + col("d", "text"))
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	// Renamed to the name of the column dropped before: silver keeps the
	// dropped one's values under a name of its own.
	stops([]string{`ALTER TABLE t RENAME COLUMN bb TO a`, `UPDATE t SET a = a + 1000 WHERE id BETWEEN 18 AND 21`},
		"column bb was renamed to a", `name = "a" with renamed_from = "bb"`)
	contract(col("id", "integer") + col("a", "integer", `renamed_from = "bb"`) + col("c", "integer") + col("d", "text"))
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	// The lake alone says the same, though the renames are older than the
	// newest schema: asof replays every schema version.
	asof := assertAsOfEqualsSource(t, h, "public.t")
	fromLake := backfillFromLakeAlone(t, h)
	for _, path := range []string{h.cfg.Warehouse.Path, asof, fromLake} {
		// a's values at the drop, NULL for the rows changed after it.
		rows := queryText(t, path, "SELECT coalesce(string_agg(id::VARCHAR, ', ' ORDER BY id), '') FROM silver.t WHERE a_dropped IS DISTINCT FROM CASE WHEN id BETWEEN 6 AND 17 THEN 'a' || id END")
		if rows != "" {
			t.Errorf("%s: the dropped column a of silver.t holds other values than it had at the drop, in rows %s", path, rows)
		}
	}
	assertSameSilver(t, h.cfg.Warehouse.Path, fromLake, "t")
	// Retyped where silver's values do not convert: accepted by the
	// contract, refused by silver, naming a value.
	stops([]string{`ALTER TABLE t ALTER COLUMN d TYPE integer USING length(d)`, `INSERT INTO t (id, a, c, d) VALUES (23, 23, 230, 23)`},
		"column d changed type from text to integer")
	contract(col("id", "integer") + col("a", "integer", `renamed_from = "bb"`) + col("c", "integer") + col("d", "integer"))
	err := runWatched(t, h.cfg, Options{}, h.log)
	if !errors.Is(err, fault.ErrSchemaBreak) || !strings.Contains(err.Error(), `column d of silver."t" cannot become INTEGER in silver`) {
		t.Fatalf("want silver to refuse the retype, got %v", err)
	}
	assertLakeExactlyOnce(t, h.cfg, "public.t")
}

// TestChangesHeldAcrossAcceptedSchemaChanges: the contracts accept
// renames and drops before they happen, and the changes made before them
// are still in Kafka when the consumer reads the new schema (lakeflow was
// stopped; one transaction even changes a column on both sides of its
// rename). Those changes keep their values: silver says what the source
// says, a dropped column keeps the values it had at the drop, and the lake
// says the same (asof, and rebuilds from the old warehouse's schemas and
// from the lake alone), though it never saw the versions in between. A
// column added under a renamed one's old name takes nothing from the
// changes before it.
// public.u's renames change case alone (its JSON column sends every
// change through the SQL decoder), are followed by the drop, or give the
// old name to a new column in the same version; public.v renames a column
// to the name of one dropped before (files written before the rename hold
// the dropped one under that name, those written after the held changes
// from before the rename; a column added after it leaves the lake without
// the version that made it); public.w adds two columns under the names of
// two it dropped (one in other case), which start empty, as in the
// source; public.x, with history, drops its last column and adds it again,
// so that changes from before spell the current names (the Go decoder
// leaves them to the SQL one); public.y, with history, is retyped
// online (add b_new, fill it, drop b, rename b_new to b, no change
// between the last two), which its contract lists as b renamed from b_new.
func TestChangesHeldAcrossAcceptedSchemaChanges(t *testing.T) {
	h := newHarness(t, "public.t", "public.u", "public.v", "public.w", "public.x", "public.y")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, b int, c text)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g, 'c' || g FROM generate_series(1, 40) g`,
		`CREATE TABLE u (id int PRIMARY KEY, "Val" int, j jsonb, x int)`, `ALTER TABLE u REPLICA IDENTITY FULL`,
		`INSERT INTO u SELECT g, g, '{"k": 1}', g FROM generate_series(1, 10) g`,
		`CREATE TABLE v (id int PRIMARY KEY, p int, q int)`, `ALTER TABLE v REPLICA IDENTITY FULL`,
		`INSERT INTO v SELECT g, g, g * 10 FROM generate_series(1, 10) g`,
		`CREATE TABLE w (id int PRIMARY KEY, r int, s int)`, `ALTER TABLE w REPLICA IDENTITY FULL`,
		`INSERT INTO w SELECT g, g, g FROM generate_series(1, 10) g`,
		`CREATE TABLE x (id int PRIMARY KEY, a int, s int)`, `ALTER TABLE x REPLICA IDENTITY FULL`,
		`INSERT INTO x SELECT g, g, g FROM generate_series(1, 10) g`,
		`CREATE TABLE y (id int PRIMARY KEY, b int, c text)`, `ALTER TABLE y REPLICA IDENTITY FULL`,
		`INSERT INTO y SELECT g, g, 'c' || g FROM generate_series(1, 10) g`)
	h.run(t, Options{})
	if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	col := func(name, typ string, from ...string) string {
		c := "[[columns]]\nname = \"" + name + "\"\ntype = \"" + typ + "\"\n"
		if len(from) > 0 {
			c += "renamed_from = \"" + from[0] + "\"\n"
		}
		return c
	}
	for file, body := range map[string]string{
		"t.toml": "table = \"public.t\"\nkey = [\"id\"]\n" + col("id", "integer") + col("bb", "integer", "b") + col("d", "integer") + col("b", "text"),
		"u.toml": "table = \"public.u\"\nkey = [\"id\"]\ncompatibility = \"none\"\n" + col("id", "integer") + col("val", "integer", "Val") + col("jj", "jsonb", "j") + col("xx", "integer", "x") + col("j", "jsonb"),
		"v.toml": "table = \"public.v\"\nkey = [\"id\"]\ncompatibility = \"none\"\n" + col("id", "integer") + col("q", "integer", "p"),
		"w.toml": "table = \"public.w\"\nkey = [\"id\"]\ncompatibility = \"none\"\n" + col("id", "integer") + col("R", "integer") + col("s", "integer"),
		"y.toml": "table = \"public.y\"\nkey = [\"id\"]\nhistory = true\n" + col("id", "integer") + col("b", "bigint", "b_new") + col("c", "text"),
		"x.toml": "table = \"public.x\"\nkey = [\"id\"]\ncompatibility = \"none\"\nhistory = true\n" + col("id", "integer") + col("a", "integer") + col("s", "integer"),
	} {
		if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, file), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := applySteps(context.Background(), h.dsn, [][]string{
		{`UPDATE t SET b = b + 1000, c = 'new' || id WHERE id <= 10`},
		{`UPDATE t SET b = b + 2000 WHERE id BETWEEN 11 AND 20`, `ALTER TABLE t RENAME COLUMN b TO bb`, `UPDATE t SET bb = bb + 100 WHERE id BETWEEN 16 AND 30`},
		{`ALTER TABLE t DROP COLUMN c`, `UPDATE t SET bb = bb + 100 WHERE id BETWEEN 26 AND 31`, `INSERT INTO t VALUES (41, 41)`},
		{`ALTER TABLE t ADD COLUMN d int`, `ALTER TABLE t ADD COLUMN b text`, `UPDATE t SET d = id, b = 'b' || id WHERE id > 35`},
		{`UPDATE u SET "Val" = "Val" + 100, x = x + 100 WHERE id <= 5`},
		{`ALTER TABLE u RENAME COLUMN "Val" TO val`, `ALTER TABLE u RENAME COLUMN x TO xx`, `ALTER TABLE u RENAME COLUMN j TO jj`, `ALTER TABLE u ADD COLUMN j jsonb`,
			`UPDATE u SET val = val + 1000, j = '{"n": 2}' WHERE id >= 8`},
		{`UPDATE u SET xx = xx + 5 WHERE id = 6`},
		{`ALTER TABLE u DROP COLUMN xx`, `UPDATE u SET val = val + 1 WHERE id = 10`},
		{`UPDATE v SET q = q + 1 WHERE id <= 2`},
		{`ALTER TABLE v DROP COLUMN q`, `UPDATE v SET p = NULL WHERE id = 3`},
		{`UPDATE v SET p = p + 100 WHERE id = 4`},
		{`ALTER TABLE v RENAME COLUMN p TO q`, `UPDATE v SET q = q + 1000 WHERE id IN (2, 5)`},
		{`ALTER TABLE v ADD COLUMN z int`, `UPDATE v SET z = id WHERE id = 7`},
		{`UPDATE w SET r = r + 10, s = s + 10 WHERE id <= 2`},
		{`UPDATE x SET s = s + 10 WHERE id <= 2`},
		{`ALTER TABLE y ADD COLUMN b_new bigint`, `UPDATE y SET b_new = b`},
		{`UPDATE y SET b = b + 1 WHERE id = 1`},
		{`ALTER TABLE y DROP COLUMN b`, `ALTER TABLE y RENAME COLUMN b_new TO b`, `UPDATE y SET b = b * 10 WHERE id = 2`},
		{`ALTER TABLE x DROP COLUMN s`, `UPDATE x SET id = id WHERE id = 3`},
		{`ALTER TABLE x ADD COLUMN s int`, `UPDATE x SET s = 100 + id WHERE id >= 8`},
		{`ALTER TABLE w DROP COLUMN r`, `ALTER TABLE w DROP COLUMN s`, `UPDATE w SET id = id WHERE id = 3`},
		{`ALTER TABLE w ADD COLUMN "R" int`, `ALTER TABLE w ADD COLUMN s int`, `UPDATE w SET "R" = 100 + id, s = 100 + id WHERE id >= 8`},
	}); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	tables := []string{"public.t", "public.u", "public.v", "public.w", "public.x", "public.y"}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, tables...)
	// The dropped columns: their values at the drop, NULL for rows changed
	// after it.
	retired := map[string]string{
		"t": "c IS DISTINCT FROM CASE WHEN id <= 10 THEN 'new' || id WHEN id <= 25 OR id BETWEEN 32 AND 35 THEN 'c' || id END",
		"u": "xx IS DISTINCT FROM CASE WHEN id <= 5 THEN id + 100 WHEN id = 6 THEN 11 WHEN id < 10 THEN id END",
		"w": "r_dropped IS DISTINCT FROM s_dropped OR r_dropped IS DISTINCT FROM CASE WHEN id <= 2 THEN id + 10 WHEN id NOT IN (3, 8, 9, 10) THEN id END",
		"x": "s_dropped IS DISTINCT FROM CASE WHEN id <= 2 THEN id + 10 WHEN id NOT IN (3, 8, 9, 10) THEN id END",
		"y": "b_dropped IS DISTINCT FROM CASE WHEN id = 1 THEN 2 WHEN id <> 2 THEN id END",
		"v": "q_dropped IS DISTINCT FROM CASE WHEN id = 1 THEN 11 WHEN id NOT IN (2, 3, 4, 5, 7) THEN id * 10 END",
	}
	asof := assertAsOfEqualsSource(t, h, tables...)
	fromLake := backfillFromLakeAlone(t, h)
	fromWarehouse := filepath.Join(t.TempDir(), "rebuilt.duckdb")
	if _, err := Backfill(context.Background(), h.cfg, BackfillOptions{All: true, Out: fromWarehouse}, h.log); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{h.cfg.Warehouse.Path, asof, fromLake, fromWarehouse} {
		db := openDuck(t, path)
		for table, wrong := range retired {
			var rows string
			queryRow(t, db, "SELECT coalesce(string_agg(id::VARCHAR, ', ' ORDER BY id), '') FROM silver."+table+" WHERE "+wrong, &rows)
			if rows != "" {
				t.Errorf("%s: the dropped column of silver.%s holds other values than it had at the drop, in rows %s", path, table, rows)
			}
		}
		db.Close()
	}
	for _, path := range []string{asof, fromLake, fromWarehouse} {
		assertSameSilver(t, h.cfg.Warehouse.Path, path, "t", "u", "v", "w", "x", "x_history", "y", "y_history")
	}
	assertLakeExactlyOnce(t, h.cfg, tables...)
}

// backfillFromLakeAlone rebuilds the warehouse from the lake alone (no
// live warehouse, nor warehouse.path to start one from, whose schemas
// would serve) into a new file, and returns its path.
func backfillFromLakeAlone(t *testing.T, h *harness) string {
	t.Helper()
	cfg := *h.cfg
	cfg.Warehouse.Live += ".moved"
	cfg.Warehouse.Path += ".moved"
	out := filepath.Join(t.TempDir(), "lake.duckdb")
	if _, err := Backfill(context.Background(), &cfg, BackfillOptions{All: true, Out: out}, h.log); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestColumnsThatChangePlacesStop: two columns renamed into each other's
// names look, by name, like no change at all; lakeflow stops (even under
// compatibility "none", which accepts every change it can follow) rather
// than mix their values in silver.
func TestColumnsThatChangePlacesStop(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, m int, n int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g, g * 10 FROM generate_series(1, 5) g`)
	if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	body := "table = \"public.t\"\nkey = [\"id\"]\ncompatibility = \"none\"\n"
	for _, c := range []string{"id", "m", "n"} {
		body += "[[columns]]\nname = \"" + c + "\"\ntype = \"integer\"\n"
	}
	if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, "t.toml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	err := runWatched(t, h.cfg, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`ALTER TABLE t RENAME COLUMN m TO tmp`, `ALTER TABLE t RENAME COLUMN n TO m`, `ALTER TABLE t RENAME COLUMN tmp TO n`},
			{`UPDATE t SET m = m + 1 WHERE id = 1`},
		})
	}}, h.log)
	stopsForAResync(t, h, err, "table public.t: column m now follows n, which it preceded")
}

// TestOnlineRetypeWithoutTheContractStops: add b_new, fill it, drop b and
// rename b_new to b, with no change between the last two, reads as b
// moving; without the contract's renamed_from lakeflow stops, and the
// hint names the column that is gone.
func TestOnlineRetypeWithoutTheContractStops(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, b int, c int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g, g FROM generate_series(1, 5) g`)
	h.run(t, Options{})
	err := runWatched(t, h.cfg, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`ALTER TABLE t ADD COLUMN b_new bigint`, `UPDATE t SET b_new = b`},
			{`ALTER TABLE t DROP COLUMN b`, `ALTER TABLE t RENAME COLUMN b_new TO b`, `UPDATE t SET b = b + 1 WHERE id = 1`},
		})
	}}, h.log)
	if !errors.Is(err, fault.ErrSchemaBreak) || !strings.Contains(err.Error(), `column b now follows c`) ||
		!strings.Contains(err.Error(), `list b in contracts/t.toml (lakeflow contracts init --table public.t writes it) with renamed_from = its old name ("b_new" is gone)`) {
		t.Fatalf("want a stop whose hint names b_new, got %v", err)
	}
}

// TestRulesFollowAnAcceptedRename: a contract that accepts a rename names
// the column by its new name in its rules (and nullable = false makes one
// more), and is taken as it stands while silver still has the old name:
// when the run stopped at the rename, and when the contract accepts a
// rename not made yet. Its rules judge the changes from before the rename
// and from after it alike, and so does a rebuild from the lake alone,
// whose older versions have neither new name.
func TestRulesFollowAnAcceptedRename(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, b int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g FROM generate_series(1, 10) g`)
	contract := func(col, from string) {
		t.Helper()
		body := fmt.Sprintf("table = \"public.t\"\nkey = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integer\"\n"+
			"[[columns]]\nname = %q\ntype = \"integer\"\nnullable = false\n%s[[rules]]\nname = \"small\"\ncheck = \"%s < 1000\"\n",
			col, map[bool]string{true: "renamed_from = \"" + from + "\"\n"}[from != ""], col)
		if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, "t.toml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	contract("b", "")
	h.run(t, Options{})
	steps := func(steps ...[]string) Options {
		return Options{Workload: func(ctx context.Context, dsn string) error { return applySteps(ctx, dsn, steps) }}
	}
	// The run stops at the rename; the contract then accepts it.
	err := runWatched(t, h.cfg, steps([]string{`INSERT INTO t VALUES (11, 5000)`}, []string{`ALTER TABLE t RENAME COLUMN b TO bb`},
		[]string{`INSERT INTO t VALUES (12, 6000)`, `UPDATE t SET bb = bb + 1 WHERE id = 1`}), h.log)
	if !errors.Is(err, fault.ErrSchemaBreak) {
		t.Fatalf("want the rename to stop the run, got %v", err)
	}
	contract("bb", "b")
	h.run(t, Options{})
	// Accepted before it is made, with changes on both sides.
	contract("c", "bb")
	h.run(t, steps([]string{`INSERT INTO t VALUES (13, 7000)`, `UPDATE t SET bb = bb + 1 WHERE id = 2`}, []string{`ALTER TABLE t RENAME COLUMN bb TO c`},
		[]string{`INSERT INTO t VALUES (14, 8000)`, `UPDATE t SET c = c + 1 WHERE id = 3`}))
	assertSilverEqualsSourceExcept(t, h.dsn, h.cfg.Warehouse.Path, map[string]string{"t": "id > 10"}, "public.t")
	// A rebuild from the lake alone replays the versions b, bb and c
	// under the contract that names c: the same.
	for _, path := range []string{h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h)} {
		held := queryText(t, path, "SELECT string_agg(key->>'id' || ':' || rules[1], ' ' ORDER BY _cdc_seq) FROM lakeflow.quarantine")
		if held != "11:t.small 12:t.small 13:t.small 14:t.small" {
			t.Fatalf("%s: quarantined %q, want each of 11 to 14 for rule t.small", path, held)
		}
	}
}

// TestReferencesFollowAPendingRename: an existence rule naming the
// referenced table's column by the new name its contract accepts ahead
// judges by the old column until the rename, then by the new one; the
// contracts are taken on every start (whatever order the tables come
// in), lakeflow check's data check reads the same columns, and a rebuild
// from the lake alone, after the rename, says the same.
func TestReferencesFollowAPendingRename(t *testing.T) {
	h := newHarness(t, "public.p", "public.c")
	pgtest.Exec(t, h.dsn, `CREATE TABLE p (id int PRIMARY KEY, code int)`, `CREATE TABLE c (id int PRIMARY KEY, pcode int)`,
		`ALTER TABLE p REPLICA IDENTITY FULL`, `ALTER TABLE c REPLICA IDENTITY FULL`,
		`INSERT INTO p VALUES (1, 100), (2, 200)`, `INSERT INTO c VALUES (1, 100)`)
	writeContracts(t, h, map[string]string{
		"p.toml": "table = \"public.p\"\nkey = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integer\"\n" +
			"[[columns]]\nname = \"code2\"\ntype = \"integer\"\nrenamed_from = \"code\"\n",
		"c.toml": "table = \"public.c\"\nkey = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integer\"\n[[columns]]\nname = \"pcode\"\ntype = \"integer\"\n" +
			"[[rules]]\nname = \"p_exists\"\nreferences = \"public.p\"\non = { pcode = \"code2\" }\n",
	})
	steps := func(steps ...[]string) Options {
		return Options{Workload: func(ctx context.Context, dsn string) error { return applySteps(ctx, dsn, steps) }}
	}
	h.run(t, steps([]string{`INSERT INTO c VALUES (2, 999), (3, 200)`}))
	for range 4 {
		h.run(t, Options{})
	}
	if r := check(t, h, PartData); r.Failed() != "" {
		t.Fatalf("lakeflow check --only data before the rename: %+v", r.Findings)
	}
	h.run(t, steps([]string{`ALTER TABLE p RENAME COLUMN code TO code2`},
		[]string{`INSERT INTO c VALUES (4, 300)`, `INSERT INTO p VALUES (3, 400)`, `INSERT INTO c VALUES (5, 400)`}))
	assertSilverEqualsSourceExcept(t, h.dsn, h.cfg.Warehouse.Path, map[string]string{"c": "id IN (2, 4)"}, "public.p", "public.c")
	held := func(path string) string {
		return queryText(t, path, "SELECT string_agg(key->>'id', ' ' ORDER BY _cdc_seq) FROM lakeflow.quarantine")
	}
	if got := held(h.cfg.Warehouse.Path); got != "2 4" {
		t.Fatalf("quarantined c %q, want 2 4", got)
	}
	if got := held(backfillFromLakeAlone(t, h)); got != "2 4" {
		t.Fatalf("rebuilt from the lake, quarantined c %q, want 2 4", got)
	}
	if r := check(t, h, PartData); r.Failed() != "" {
		t.Fatalf("lakeflow check --only data after the rename: %+v", r.Findings)
	}
}
