package pipeline

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// churn writes table b while it is copied: updates, deletes and inserts
// of keys all over its range (inside and outside the chunk being read),
// in small transactions, until ctx ends or n are done.
func churn(ctx context.Context, dsn string, n, keys int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < n && ctx.Err() == nil; i++ {
		k := rng.IntN(keys) + 1
		var stmt string
		switch i % 4 {
		case 0, 1:
			stmt = fmt.Sprintf("UPDATE b SET v = v + 1, note = 'changed %d' WHERE id BETWEEN %d AND %d", i, k, k+20)
		case 2:
			stmt = fmt.Sprintf("DELETE FROM b WHERE id BETWEEN %d AND %d", k, k+3)
		default:
			stmt = fmt.Sprintf("INSERT INTO b VALUES (%d, %d, 'new'), (%d, 0, 'new') ON CONFLICT (id) DO UPDATE SET note = 'upserted'", k, i, keys+i+1)
		}
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

func addTable(t *testing.T, h *harness, table string) {
	t.Helper()
	ct, err := config.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	h.cfg.Source.Tables = append(h.cfg.Source.Tables, ct)
}

func removeTable(h *harness, table string) {
	h.cfg.Source.Tables = slices.DeleteFunc(h.cfg.Source.Tables, func(ct config.Table) bool { return ct.String() == table })
}

// TestTableAddedWhileStreaming: a table added to source.tables after the
// first run is copied in chunks while the others stream, without a new
// slot, while a workload changes its rows inside and outside the chunk
// being read; silver then equals the source. Taken out, it is no longer
// captured (silver keeps it); put back, it is copied again and reconciled:
// rows deleted meanwhile are deleted in silver too, and the history gains
// versions for what changed, not a copy of every row.
func TestTableAddedWhileStreaming(t *testing.T) {
	h := newHarness(t, "public.a")
	if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	contract := "table = \"public.b\"\nkey = [\"id\"]\nhistory = true\n" +
		"[[columns]]\nname = \"id\"\ntype = \"integer\"\n[[columns]]\nname = \"v\"\ntype = \"integer\"\n[[columns]]\nname = \"note\"\ntype = \"text\"\n"
	if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, "b.toml"), []byte(contract), 0o644); err != nil {
		t.Fatal(err)
	}
	const keys = 20000
	pgtest.Exec(t, h.dsn, `CREATE TABLE a (id int PRIMARY KEY, v int)`, `INSERT INTO a SELECT g, g FROM generate_series(1, 100) g`,
		`CREATE TABLE b (id int PRIMARY KEY, v int, note text)`,
		fmt.Sprintf(`INSERT INTO b SELECT g, g, 'row ' || g FROM generate_series(1, %d) g`, keys))
	h.run(t, Options{})
	slots := func() string {
		conn := pgtest.Connect(t, h.dsn)
		defer conn.Close(context.Background())
		var s string
		if err := conn.QueryRow(context.Background(), "SELECT string_agg(slot_name, ',') FROM pg_replication_slots WHERE database = current_database()").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	slot := slots()

	addTable(t, h, "public.b")
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error { return churn(ctx, dsn, 400, keys) }})
	if !strings.Contains(h.logs.String(), "table copied while the stream ran") {
		t.Fatal("no copy logged")
	}
	if after := slots(); after != slot {
		t.Errorf("slots %q after adding a table, want the same %q", after, slot)
	}
	if out, _ := lakeflowCmd(t, "--config", h.file, "status").Output(); strings.Contains(string(out), "copying") {
		t.Errorf("status says a copy is under way once it is done:\n%s", out)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a", "public.b")
	assertLakeExactlyOnce(t, h.cfg, "public.a", "public.b")
	var rows, chunks int
	fmt.Sscanf(queryText(t, h.cfg.Warehouse.Path, fmt.Sprintf("SELECT count(*) FILTER (op = 'r') || ' ' || count(DISTINCT _cdc_seq) FILTER (op = 'r') FROM read_parquet(%q)",
		filepath.Join(h.cfg.Lake.Dir, "b", "*", "*.parquet"))), "%d %d", &rows, &chunks)
	if rows < keys*3/4 || chunks < 3 {
		t.Errorf("the lake holds %d rows of the copy of b at %d positions, want most of its %d rows in 3 chunks or more", rows, chunks, keys)
	}

	// Out: no longer captured, silver keeps it.
	removeTable(h, "public.b")
	pgtest.Exec(t, h.dsn, `DELETE FROM b WHERE id % 7 = 0`, `UPDATE b SET note = 'while out' WHERE id % 5 = 0`, `INSERT INTO b VALUES (-1, -1, 'while out')`,
		`UPDATE a SET v = v + 1`)
	h.run(t, Options{})
	if !strings.Contains(h.logs.String(), "is no longer captured") {
		t.Error("taking b out was not logged")
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a")
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM silver.b WHERE note = 'while out'"); got != "0" {
		t.Errorf("silver.b holds %s rows changed while b was out, want 0", got)
	}

	// Back: copied again, and the rows deleted meanwhile leave silver.
	addTable(t, h, "public.b")
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error { return churn(ctx, dsn, 200, keys) }})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a", "public.b")
	assertLakeExactlyOnce(t, h.cfg, "public.a", "public.b")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "a", "b")
	// A copied row (ord 0) opens a version only if it holds something
	// else than the version before it: the copy of an unchanged row opens
	// none. (An update that changes nothing opens one, as the source says.)
	repeats := queryText(t, h.cfg.Warehouse.Path, `SELECT count(*) FROM (SELECT v, note, valid_from, _cdc_ord,
		lag(v) OVER w AS pv, lag(note) OVER w AS pn, lag(valid_to) OVER w AS pto FROM silver.b_history WINDOW w AS (PARTITION BY id ORDER BY valid_from))
		WHERE _cdc_ord = 0 AND pto = valid_from AND pv IS NOT DISTINCT FROM v AND pn IS NOT DISTINCT FROM note`)
	if repeats != "0" {
		t.Errorf("silver.b_history holds %s versions that repeat the one before", repeats)
	}
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM silver.b_history WHERE is_current"); got != queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM silver.b WHERE NOT _deleted") {
		t.Errorf("silver.b_history has %s current versions, silver.b a different number of live rows", got)
	}
}

// TestResyncWhileFollowing: a type change whose USING expression rewrote
// every value comes with no change event: silver keeps the old values,
// and lakeflow warns, naming lakeflow resync. The command, given while
// run --follow runs and a workload writes the table, copies it again:
// silver then equals the source, and a
// rebuild from the lake says the same.
func TestResyncWhileFollowing(t *testing.T) {
	h := newHarness(t, "public.b")
	const keys = 20000
	pgtest.Exec(t, h.dsn, `CREATE TABLE b (id int PRIMARY KEY, v int, note text)`,
		fmt.Sprintf(`INSERT INTO b SELECT g, g, 'row ' || g FROM generate_series(1, %d) g`, keys))
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `ALTER TABLE b ALTER COLUMN v TYPE bigint USING v * 100`, `UPDATE b SET note = 'after' WHERE id = 1`)
	h.run(t, Options{})
	if !strings.Contains(h.logs.String(), "lakeflow resync public.b") {
		t.Fatal("the rewrite was not warned about")
	}
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT v FROM silver.b WHERE id = 2"); got != "2" {
		t.Fatalf("silver.b holds v = %s for id 2 before the resync, want the old 2: the test proves nothing", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- Run(ctx, h.cfg, Options{Follow: true, Workload: func(ctx context.Context, dsn string) error { return churn(ctx, dsn, 300, keys) }}, h.log)
	}()
	waitFor(t, "the pipeline running", func() bool { return strings.Contains(h.logs.String(), "streaming") })
	out, err := withStderr(lakeflowCmd(t, "--config", h.file, "resync", "public.b").Output())
	if err != nil || !strings.Contains(string(out), "the running pipeline starts it") {
		t.Fatalf("lakeflow resync: %v: %s", err, out)
	}
	waitFor(t, "the copy", func() bool { return strings.Contains(h.logs.String(), "table copied while the stream ran") })
	cancel()
	if err := waitStopped(t, errc); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.b")
	assertLakeExactlyOnce(t, h.cfg, "public.b")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "b")
	if files, _ := filepath.Glob(filepath.Join(h.cfg.DataDir, "requests", "*")); len(files) != 0 {
		t.Errorf("requests left: %v", files)
	}
}

// TestKillDuringACopy: lakeflow is killed (SIGKILL) while it copies a
// table added to source.tables; the next run goes on from the last chunk
// Kafka held, not from the first: the lake holds the table's rows once,
// but those of the one chunk read again, and silver equals the source.
func TestKillDuringACopy(t *testing.T) {
	h := newHarness(t, "public.a", "public.b")
	const keys = 60000
	pgtest.Exec(t, h.dsn, `CREATE TABLE a (id int PRIMARY KEY)`, `INSERT INTO a VALUES (1)`,
		`CREATE TABLE b (id int PRIMARY KEY, v int, note text)`,
		fmt.Sprintf(`INSERT INTO b SELECT g, g, repeat('x', 200) FROM generate_series(1, %d) g`, keys))
	removeTable(h, "public.b") // the file keeps it: the binary's runs add it
	h.run(t, Options{})
	p := start(t, h, "run", "--follow")
	waitFor(t, "two chunks copied", func() bool { return strings.Count(h.logs.String(), `msg="chunk copied"`) >= 2 })
	p.kill(t)
	if strings.Contains(h.logs.String(), "table copied while the stream ran") {
		t.Fatal("the copy ended before the kill: the test proves nothing")
	}
	pgtest.Exec(t, h.dsn, `UPDATE b SET v = -v WHERE id % 1000 = 0`, `DELETE FROM b WHERE id % 999 = 0`)
	if err := start(t, h, "run").wait(t); err != nil {
		t.Fatal(err)
	}
	addTable(t, h, "public.b")
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.a", "public.b")
	assertLakeExactlyOnce(t, h.cfg, "public.a", "public.b")
	copied := queryText(t, h.cfg.Warehouse.Path, fmt.Sprintf("SELECT count(*) FROM read_parquet(%q) WHERE op = 'r'", filepath.Join(h.cfg.Lake.Dir, "b", "*", "*.parquet")))
	var n int
	fmt.Sscan(copied, &n)
	if n < keys-keys/999 || n > keys+8192 {
		t.Errorf("the lake holds %d copied rows of b's %d: more than one chunk read again, or rows missing", n, keys)
	}
}
