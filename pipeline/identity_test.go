package pipeline

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestReplicaIdentityDefault: tables as PostgreSQL creates them, with
// REPLICA IDENTITY DEFAULT: updates carry the new row (a large value
// left unchanged only as a marker), deletes and key changes the old key.
// Silver, history, asof and a rebuild from the lake all equal the source;
// NOTHING is refused at start with the command that fixes it.
func TestReplicaIdentityDefault(t *testing.T) {
	h := newHarness(t, "public.d", "public.p")
	// Random text does not compress: stored out of line (TOAST).
	big := `(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400))`
	pgtest.Exec(t, h.dsn, `CREATE TABLE d (id int PRIMARY KEY, small int, big text)`,
		`INSERT INTO d SELECT g, g, `+big+` FROM generate_series(1, 8) g`,
		`CREATE TABLE p (id int, day date, v text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)`,
		`CREATE TABLE p_1 PARTITION OF p FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')`,
		`INSERT INTO p VALUES (1, '2024-01-05', 'a'), (2, '2024-01-06', 'b')`)
	h.run(t, Options{})
	// Key changes that leave the large value unchanged, each alone in a
	// batch: the value is silver's, under the old key.
	pgtest.Exec(t, h.dsn, `UPDATE d SET id = 101 WHERE id = 1`)
	h.run(t, Options{})
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`UPDATE d SET small = small + 10 WHERE id IN (2, 3)`},
			{`UPDATE d SET small = small + 10 WHERE id = 2`},
			// A key change after an update in the same batch, then an
			// update of the new key, then a second key change.
			{`UPDATE d SET id = 104, small = 0 WHERE id = 4`},
			{`UPDATE d SET small = 44 WHERE id = 104`},
			{`UPDATE d SET id = 204 WHERE id = 104`},
			{`UPDATE d SET big = ` + big + ` WHERE id = 5`, `UPDATE d SET id = 105 WHERE id = 5`},
			{`DELETE FROM d WHERE id IN (6, 101)`},
			{`INSERT INTO d VALUES (6, 6, 'small again')`},
			{`CREATE TABLE p_2 PARTITION OF p FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')`,
				`INSERT INTO p VALUES (3, '2024-02-02', 'c')`},
			{`UPDATE p SET v = 'c2' WHERE id = 3`, `UPDATE p SET day = '2024-02-06' WHERE id = 2`, `DELETE FROM p WHERE id = 1`},
		})
	}})
	unchanged := queryText(t, h.cfg.Warehouse.Path, fmt.Sprintf("SELECT count(*) FROM read_parquet(%q, union_by_name = true) WHERE unchanged IS NOT NULL",
		filepath.Join(h.cfg.Lake.Dir, "d", "*", "*.parquet")))
	keyOnly := queryText(t, h.cfg.Warehouse.Path, fmt.Sprintf("SELECT count(*) FROM read_parquet(%q, union_by_name = true) WHERE op = 'd' AND before.small IS NULL",
		filepath.Join(h.cfg.Lake.Dir, "d", "*", "*.parquet")))
	if unchanged != "8" || keyOnly != "6" {
		t.Errorf("the lake holds %s changes that left the large value unchanged and %s deletes with the old key alone, want 8 and 6: the test proves less than it says",
			unchanged, keyOnly)
	}
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM silver.d WHERE NOT _deleted AND length(big) = 12800"); got != "6" {
		t.Errorf("%s rows of silver.d hold their large value, want 6", got)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.d", "public.p")
	assertAsOfEqualsSource(t, h, "public.d", "public.p")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "d", "p")
	assertLakeExactlyOnce(t, h.cfg, "public.d", "public.p")

	// NOTHING names no row: refused at start, naming the fix, which works.
	pgtest.Exec(t, h.dsn, `CREATE TABLE p_3 PARTITION OF p FOR VALUES FROM ('2024-03-01') TO ('2024-04-01')`,
		`ALTER TABLE p_3 REPLICA IDENTITY NOTHING`)
	err := runWatched(t, h.cfg, Options{}, h.log)
	if !errors.Is(err, fault.ErrSource) || !strings.Contains(fmt.Sprint(err), "ALTER TABLE public.p_3 REPLICA IDENTITY DEFAULT;") {
		t.Fatalf("run with a partition of identity NOTHING: %v, want a source error naming ALTER TABLE public.p_3 REPLICA IDENTITY DEFAULT", err)
	}
	pgtest.Exec(t, h.dsn, `ALTER TABLE public.p_3 REPLICA IDENTITY DEFAULT`, `INSERT INTO p VALUES (9, '2024-03-03', 'z')`, `UPDATE p SET v = 'z2' WHERE id = 9`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.d", "public.p")
}

// TestKeyOnlyDeleteKeepsAColumnAddedSince: a delete carrying the key
// alone (REPLICA IDENTITY DEFAULT) leaves the deleted row with its last
// version's values, a column added with a default since included
// (PostgreSQL gave the row that default), whether that version came in
// the delete's batch or before it, in silver and in a rebuild from the
// lake (which read it as NULL).
func TestKeyOnlyDeleteKeepsAColumnAddedSince(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `INSERT INTO t SELECT g, g FROM generate_series(1, 5) g`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `INSERT INTO t VALUES (6, 6)`, `ALTER TABLE t ADD COLUMN x int DEFAULT 7`, `DELETE FROM t WHERE id IN (3, 6)`)
	h.run(t, Options{})
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT string_agg(format('{}:{}', id, coalesce(x::VARCHAR, 'NULL')), ' ' ORDER BY id) FROM silver.t WHERE _deleted"); got != "3:7 6:7" {
		t.Fatalf("the deleted rows hold %s, want 3:7 6:7", got)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "t")
}
