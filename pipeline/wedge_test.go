package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
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

// TestStrayRecordsOnMetaTopics: records another Kafka client writes to
// lakeflow's meta topics — garbage, and well-formed ones lakeflow did
// not write (a watermark claiming a huge position and the topics' real
// ends, a schema that changes the table, a state that undoes the
// snapshot) — are set aside as dead letters, once, and move nothing:
// not where batches end, not the positions, not lakeflow.batches.
func TestStrayRecordsOnMetaTopics(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g FROM generate_series(1, 10) g`)
	h.run(t, Options{})
	prefix := h.cfg.Kafka.TopicPrefix
	huge := uint64(1) << 62
	withBroker(t, h, func(cl *kgo.Client) {
		ctx := context.Background()
		topic := kafka.TableTopic(prefix, "public", "t")
		ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		end, _ := ends.Lookup(topic, 0)
		forged := fmt.Sprintf(`{"seq":%d,"end":%d,"offsets":{%q:{"0":%d}}}`, huge, huge, topic, end.Offset+3)
		for _, r := range []*kgo.Record{
			{Topic: kafka.WatermarkTopic(prefix), Value: []byte("hello")},
			{Topic: kafka.WatermarkTopic(prefix), Value: []byte(forged)},
			{Topic: kafka.SchemaTopic(prefix), Key: []byte("public.t"), Value: []byte("hello")},
			{Topic: kafka.SchemaTopic(prefix), Key: []byte("public.t"), Value: []byte(`{"topic":"` + topic + `","schema":{"schema":"public","table":"t","columns":[{"name":"id","type":{"kind":"int4","name":"integer"},"key":true},{"name":"w","type":{"kind":"text","name":"text"}}],"since":{"seq":1,"ord":0}}}`)},
			{Topic: kafka.StateTopic(prefix), Key: []byte("source"), Value: []byte("hello")},
			{Topic: kafka.StateTopic(prefix), Key: []byte("source"), Value: []byte(`{"slot":"` + h.cfg.Source.Slot + `","consistent_point":1,"snapshotted":false,"tables":["public.t"]}`)},
		} {
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	})
	pgtest.Exec(t, h.dsn, `UPDATE t SET v = v + 100 WHERE id <= 3`, `INSERT INTO t VALUES (11, 11)`, `DELETE FROM t WHERE id = 10`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `INSERT INTO t VALUES (12, 12)`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	assertLakeExactlyOnce(t, h.cfg, "public.t")
	if got := queryText(t, h.cfg.Warehouse.Path, fmt.Sprintf("SELECT count(*) FROM lakeflow.batches WHERE lsn >= %d OR end_lsn >= %d", huge, huge)); got != "0" {
		t.Errorf("%s batches took the forged watermark's position", got)
	}
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT string_agg(column_name, ',' ORDER BY column_name) FROM information_schema.columns WHERE table_schema = 'silver' AND table_name = 't' AND column_name NOT LIKE '\\_%' ESCAPE '\\'"); got != "id,v" {
		t.Errorf("silver.t has the columns %s: the forged schema was applied", got)
	}
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT string_agg(split_part(topic, '._', 2) || ':' || failure_stage, ',' ORDER BY topic, \"offset\") FROM lakeflow.dlq"); got != "schemas:meta,schemas:meta,state:meta,state:meta,watermarks:meta,watermarks:meta" {
		t.Errorf("lakeflow.dlq holds %s, want each stray once", got)
	}
	if n := queryText(t, h.cfg.Warehouse.Path, fmt.Sprintf("SELECT count(*) FROM read_parquet(%q)", filepath.Join(h.cfg.Lake.Dir, "_dlq", "*", "*", "*.parquet"))); n != "6" {
		t.Errorf("the lake's _dlq holds %s records, want the 6 strays once", n)
	}
}

// TestIdleCostsNothing: while the captured tables are idle, heartbeats
// move the slot on, and lakeflow writes nothing: no batch, no copy of
// the warehouse, no lake file.
func TestIdleCostsNothing(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `ALTER TABLE t REPLICA IDENTITY FULL`, `INSERT INTO t VALUES (1, 1)`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, h.cfg, Options{Follow: true}, h.log) }()
	conn := pgtest.Connect(t, h.dsn)
	pgtest.Exec(t, h.dsn, `INSERT INTO t VALUES (2, 2)`)
	published := func() string {
		out, err := lakeflowCmd(t, "--config", h.file, "sql", "--format", "csv", "SELECT batch, (SELECT count(*) FROM silver.t) FROM lakeflow.published").Output()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err != nil || len(lines) != 2 {
			return ""
		}
		return lines[1] // batch,rows
	}
	var copied string
	waitFor(t, "the change in the published warehouse", func() bool {
		copied = published()
		return strings.HasSuffix(copied, ",2")
	})
	info, err := os.Stat(h.cfg.Warehouse.Path)
	if err != nil {
		t.Fatal(err)
	}
	lakeFiles := func() int {
		files, _ := filepath.Glob(filepath.Join(h.cfg.Lake.Dir, "t", "*", "*.parquet"))
		return len(files)
	}
	files := lakeFiles()
	// Twice: the slot passes WAL written after the change, which only the
	// heartbeats' watermarks can take it past.
	for range 2 {
		var wal string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&wal); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the slot past "+wal, func() bool {
			var past bool
			err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn > $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2", wal, h.cfg.Source.Slot).Scan(&past)
			return err == nil && past
		})
	}
	if now := published(); now != copied {
		t.Errorf("the published warehouse went from %q to %q while idle", copied, now)
	}
	if again, err := os.Stat(h.cfg.Warehouse.Path); err != nil || !again.ModTime().Equal(info.ModTime()) {
		t.Errorf("the published warehouse was written again while idle")
	}
	if n := lakeFiles(); n != files {
		t.Errorf("%d lake files were written while idle", n-files)
	}
	cancel()
	if err := waitStopped(t, errc); err != nil {
		t.Fatal(err)
	}
	if got, want := queryText(t, h.cfg.Warehouse.Path, "SELECT max(batch) FROM lakeflow.batches"), strings.Split(copied, ",")[0]; got != want {
		t.Errorf("lakeflow.batches goes up to batch %s, the change's was %s: idle heartbeats made batches", got, want)
	}
}

// waitFor waits for cond, polling, for at most a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

// TestRebuiltFromTheLakeAfterKafkaTrimmed: the warehouse is lost, Kafka
// has trimmed what it had read, and lakeflow backfill --all rebuilds it
// from the lake alone: the runs after it read Kafka on from where the
// lake ends.
func TestRebuiltFromTheLakeAfterKafkaTrimmed(t *testing.T) {
	defer func(d time.Duration) { trimInterval = d }(trimInterval)
	trimInterval = 50 * time.Millisecond
	h := newHarnessWith(t, "retention = \"1ms\"\nretention_bytes = \"1B\"", "public.t", "public.u")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `CREATE TABLE u (id int PRIMARY KEY, v int)`,
		`ALTER TABLE t REPLICA IDENTITY FULL`, `ALTER TABLE u REPLICA IDENTITY FULL`)
	change := func(from int) Options {
		return Options{Workload: func(ctx context.Context, dsn string) error {
			var steps [][]string
			for i := from; i < from+40; i++ {
				steps = append(steps, []string{fmt.Sprintf(`INSERT INTO t VALUES (%d, %d)`, i, i), fmt.Sprintf(`INSERT INTO u VALUES (%d, %d)`, i, i),
					fmt.Sprintf(`UPDATE t SET v = v + 1 WHERE id = %d`, from)})
			}
			return applySteps(ctx, dsn, steps)
		}}
	}
	h.run(t, change(1))
	h.run(t, change(100))
	if start, _ := topicOffsets(t, h.cfg, "t"); start == 0 {
		t.Fatal("Kafka trimmed nothing: the test proves nothing")
	}
	lose(t, h)
	if _, err := Backfill(context.Background(), h.cfg, BackfillOptions{All: true}, h.log); err != nil {
		t.Fatal(err)
	}
	h.run(t, change(200))
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t", "public.u")
	assertLakeExactlyOnce(t, h.cfg, "public.t", "public.u")
}

// lose deletes the warehouse files, live and published.
func lose(t *testing.T, h *harness) {
	t.Helper()
	for _, p := range []string{h.cfg.Warehouse.Live, h.cfg.Warehouse.Path} {
		for _, f := range []string{p, p + ".wal"} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
	}
}

// TestNewWarehouseOnALakeOfTwoKafkaEras: the Kafka data was lost once
// (the warehouse kept), then the warehouse too. Kafka no longer has the
// events of the lake's first era: a run does not rebuild the warehouse
// from Kafka (it would miss them, and take the second era's offsets for
// the first's), it stops and names lakeflow backfill --all, which does.
func TestNewWarehouseOnALakeOfTwoKafkaEras(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g FROM generate_series(1, 50) g`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `UPDATE t SET v = v + 1 WHERE id <= 20`)
	h.run(t, Options{})
	if err := os.RemoveAll(h.cfg.Kafka.Dir); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, h.dsn, `UPDATE t SET v = v + 1 WHERE id > 40`, `INSERT INTO t VALUES (51, 51)`)
	h.run(t, Options{})
	lose(t, h)
	err := runWatched(t, h.cfg, Options{}, h.log)
	if err == nil || !strings.Contains(err.Error(), "lakeflow backfill --all") {
		t.Fatalf("want a stop that names lakeflow backfill --all, got %v", err)
	}
	if _, err := Backfill(context.Background(), h.cfg, BackfillOptions{All: true}, h.log); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, h.dsn, `DELETE FROM t WHERE id = 3`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	assertLakeMatchesSilver(t, h.cfg, "t")
}

// TestNamesThatLookLikeLakeflows: a table whose name starts with '_' is
// a table like any other (asof and a rebuild from the lake alone see
// it); one whose lake directory would be lakeflow's own, or whose silver
// name is another's history table, is refused at start with the reason.
func TestNamesThatLookLikeLakeflows(t *testing.T) {
	h := newHarness(t, "public._t", "public.customers", "public.customers_history")
	pgtest.Exec(t, h.dsn, `CREATE TABLE _t (id int PRIMARY KEY, v int)`, `ALTER TABLE _t REPLICA IDENTITY FULL`,
		`CREATE TABLE customers (id int PRIMARY KEY, v int)`, `ALTER TABLE customers REPLICA IDENTITY FULL`,
		`CREATE TABLE customers_history (id int PRIMARY KEY, v int)`, `ALTER TABLE customers_history REPLICA IDENTITY FULL`,
		`INSERT INTO _t SELECT g, g FROM generate_series(1, 5) g`, `INSERT INTO customers VALUES (1, 1)`, `INSERT INTO customers_history VALUES (1, 1)`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `UPDATE _t SET v = 0 WHERE id = 2`, `DELETE FROM _t WHERE id = 3`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public._t")
	assertAsOfEqualsSource(t, h, "public._t", "public.customers", "public.customers_history")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "_t", "customers", "customers_history")

	if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, "customers.toml"), []byte("table = \"public.customers\"\nkey = [\"id\"]\nhistory = true\n"+
		"[[columns]]\nname = \"id\"\ntype = \"integer\"\n[[columns]]\nname = \"v\"\ntype = \"integer\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := runWatched(t, h.cfg, Options{}, h.log)
	if !errors.Is(err, fault.ErrConfig) || !strings.Contains(err.Error(), "the captured table public.customers_history has that name") {
		t.Errorf("want history = true refused beside a captured customers_history, got %v", err)
	}
	for _, name := range []string{"_dlq", "_Staging"} {
		body := strings.Replace(string(must(os.ReadFile(h.file))), `"public._t"`, `"public.`+name+`"`, 1)
		file := filepath.Join(t.TempDir(), "lakeflow.toml")
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := config.Load(file, nil); err == nil || !strings.Contains(err.Error(), "holds lakeflow's own files") {
			t.Errorf("a table named %s: want it refused, got %v", name, err)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestUnchangedToastWithoutFullIdentity: a partition created after the
// start does not log full rows; an update that leaves a large (TOASTed)
// value as it was arrives without it. The value is the version before's:
// silver's, or an earlier change's in the same batch. asof and a rebuild
// from the lake say the same.
func TestUnchangedToastWithoutFullIdentity(t *testing.T) {
	h := newHarness(t, "public.m")
	pgtest.Exec(t, h.dsn, `CREATE TABLE m (id int, day date, small int, big text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)`,
		`CREATE TABLE m_1 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')`, `ALTER TABLE m_1 REPLICA IDENTITY FULL`,
		`INSERT INTO m VALUES (1, '2024-01-05', 1, 'x')`)
	h.run(t, Options{})
	// Random text does not compress: stored out of line.
	big := `(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400))`
	pgtest.Exec(t, h.dsn, `CREATE TABLE m_2 PARTITION OF m FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')`,
		`INSERT INTO m SELECT g, '2024-02-05', g, `+big+` FROM generate_series(1, 4) g`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `UPDATE m SET small = small + 10 WHERE day = '2024-02-05'`)
	h.run(t, Options{})
	// In one batch: unchanged twice, and changed, then unchanged.
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`UPDATE m SET small = small + 100 WHERE id = 1 AND day = '2024-02-05'`},
			{`UPDATE m SET small = small + 100 WHERE id = 1 AND day = '2024-02-05'`},
			{`UPDATE m SET big = ` + big + ` WHERE id = 2 AND day = '2024-02-05'`},
			{`UPDATE m SET small = small + 100 WHERE id = 2 AND day = '2024-02-05'`},
			{`DELETE FROM m WHERE id = 3 AND day = '2024-02-05'`},
		})
	}})
	left := queryText(t, h.cfg.Warehouse.Path, fmt.Sprintf("SELECT count(*) FROM read_parquet(%q, union_by_name = true) WHERE unchanged IS NOT NULL",
		filepath.Join(h.cfg.Lake.Dir, "m", "*", "*.parquet")))
	if left != "7" {
		t.Errorf("the lake holds %s changes that left the large value unchanged, want 7: the test proves less than it says", left)
	}
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM silver.m WHERE length(big) = 12800"); got != "4" {
		t.Errorf("%s rows of silver.m hold their large value, want 4", got)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.m")
	assertAsOfEqualsSource(t, h, "public.m")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "m")

	// A change held back by a rule, then one that leaves its large value
	// unchanged: that value is the held change's (still the source's),
	// which the rule holds back again; silver keeps the version before
	// both, never a row the source never had.
	if err := os.MkdirAll(h.cfg.Contracts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	contract := "table = \"public.m\"\nkey = [\"id\", \"day\"]\n" +
		"[[columns]]\nname = \"id\"\ntype = \"integer\"\n[[columns]]\nname = \"day\"\ntype = \"date\"\n" +
		"[[columns]]\nname = \"small\"\ntype = \"integer\"\n[[columns]]\nname = \"big\"\ntype = \"text\"\n" +
		"[[rules]]\nname = \"big_good\"\ncheck = \"big NOT LIKE 'bad%'\"\n"
	if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, "m.toml"), []byte(contract), 0o644); err != nil {
		t.Fatal(err)
	}
	before := queryText(t, h.cfg.Warehouse.Path, "SELECT small || ':' || md5(big) FROM silver.m WHERE id = 4")
	pgtest.Exec(t, h.dsn, `UPDATE m SET big = 'bad' || `+big+` WHERE id = 4`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `UPDATE m SET small = small + 1000 WHERE id = 4`)
	h.run(t, Options{})
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT small || ':' || md5(big) FROM silver.m WHERE id = 4"); got != before {
		t.Errorf("silver.m holds %s for id 4, want the version before the held change (%s)", got, before)
	}
	if got := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) || ',' || count(*) FILTER (json_extract_string(\"row\", '$.big') LIKE 'bad%') FROM lakeflow.quarantine"); got != "2,2" {
		t.Errorf("lakeflow.quarantine holds %s, want both changes of id 4, each with the held large value", got)
	}
	assertSilverEqualsSourceExcept(t, h.dsn, h.cfg.Warehouse.Path, heldBack(t, h.cfg.Warehouse.Path, "public.m"), "public.m")
	_, out := asofAtEnd(t, h)
	assertSameSilver(t, h.cfg.Warehouse.Path, out, "m")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "m")
}

// TestSlotDroppedByAnOperator: the replication slot is dropped while
// lakeflow is stopped, and changes are made meanwhile (their WAL is read
// by no one). The run stops, naming lakeflow resync --all; after it, the
// slot is made again and every table copied again while it streams:
// silver follows the source, rows deleted meanwhile included, and lake
// and history go on.
func TestSlotDroppedByAnOperator(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g FROM generate_series(1, 20) g`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `SELECT pg_drop_replication_slot('`+h.cfg.Source.Slot+`')`,
		`DELETE FROM t WHERE id <= 5`, `UPDATE t SET v = -v WHERE id > 15`, `INSERT INTO t VALUES (21, 21)`)
	resyncsAll(t, h)
	assertLakeExactlyOnce(t, h.cfg, "public.t")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "t")
}

// resyncsAll checks that a run stops for the lost slot naming lakeflow
// resync --all, and that the command gets past it: the slot is made again,
// and silver (of table t) follows the source, then and after a change.
func resyncsAll(t *testing.T, h *harness) {
	t.Helper()
	err := runWatched(t, h.cfg, Options{}, h.log)
	if !errors.Is(err, fault.ErrSource) || !strings.Contains(err.Error(), "run lakeflow resync --all") {
		t.Fatalf("want a stop that names lakeflow resync --all, got %v", err)
	}
	if _, _, err := RequestResync(h.cfg, nil, true); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	if !strings.Contains(h.logs.String(), "made again") {
		t.Error("the slot was not made again")
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	pgtest.Exec(t, h.dsn, `UPDATE t SET v = 0 WHERE id = 10`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
}

// TestSlotInvalidated: PostgreSQL invalidates the slot while lakeflow is
// stopped (max_slot_wal_keep_size: the WAL it held is removed). The run
// stops naming lakeflow resync --all, which makes the slot again in its
// place and copies every table: silver follows the source.
func TestSlotInvalidated(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `INSERT INTO t SELECT g, g FROM generate_series(1, 20) g`,
		`CREATE TABLE filler (id serial PRIMARY KEY, v text)`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`, `SELECT pg_reload_conf()`)
	t.Cleanup(func() { pgtest.Exec(t, h.dsn, `ALTER SYSTEM RESET max_slot_wal_keep_size`, `SELECT pg_reload_conf()`) })
	pgtest.Exec(t, h.dsn, `DELETE FROM t WHERE id <= 5`, `UPDATE t SET v = -v WHERE id > 15`)
	conn := pgtest.Connect(t, h.dsn)
	defer conn.Close(context.Background())
	status := ""
	for i := 0; i < 10 && status != "lost"; i++ {
		pgtest.Exec(t, h.dsn, `INSERT INTO filler (v) SELECT repeat('x', 1000) FROM generate_series(1, 20000)`, `SELECT pg_switch_wal()`, `CHECKPOINT`)
		if err := conn.QueryRow(context.Background(), "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", h.cfg.Source.Slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
	}
	if status != "lost" {
		t.Fatalf("the slot's wal_status is %q, want lost: the test proves nothing", status)
	}
	resyncsAll(t, h)
}

// TestColumnFilledByATableRewrite: a column added with a DEFAULT
// PostgreSQL evaluates per row fills every existing row without a change
// event. The run stops (exit 4) before writing anything of the new shape,
// naming the way on; under a new slot every table is taken again, and
// silver holds the values PostgreSQL wrote.
func TestColumnFilledByATableRewrite(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, g FROM generate_series(1, 20) g`)
	h.run(t, Options{})
	pgtest.Exec(t, h.dsn, `ALTER TABLE t ADD COLUMN r double precision DEFAULT random()`, `UPDATE t SET v = 0 WHERE id = 1`)
	stopsForAResync(t, h, runWatched(t, h.cfg, Options{}, h.log), "rewrote the table")
}

// stopsForAResync checks that err is a schema break that says want and
// names lakeflow resync public.t as the way on, and that it gets past
// it: the table's rows are copied again, and silver equals the source.
func stopsForAResync(t *testing.T, h *harness, err error, want string) {
	t.Helper()
	if !errors.Is(err, fault.ErrSchemaBreak) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "lakeflow resync public.t") {
		t.Fatalf("want a stop saying %q, with lakeflow resync public.t as the way on, got %v", want, err)
	}
	if err := runWatched(t, h.cfg, Options{}, h.log); !errors.Is(err, fault.ErrSchemaBreak) {
		t.Fatalf("a run without the resync: %v, want the same stop", err)
	}
	if _, _, err := RequestResync(h.cfg, []string{"public.t"}, false); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	assertSameSilver(t, h.cfg.Warehouse.Path, backfillFromLakeAlone(t, h), "t")
}

// TestAsOfAfterAPartOfATransaction: a transaction larger than the batch
// limits is applied in parts; the lake as a stop between two parts
// leaves it (the last part's files gone) holds it in part. asof at its
// end answers as of the last batch that ended at a transaction boundary,
// and says so.
func TestAsOfAfterAPartOfATransaction(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v text)`, `ALTER TABLE t REPLICA IDENTITY FULL`,
		`INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g`)
	h.run(t, Options{})
	h.cfg.Pipeline.BatchBytes = 64 << 10
	pgtest.Exec(t, h.dsn, `INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(100, 150100) g`)
	h.run(t, Options{})
	if n := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM lakeflow.batches WHERE NOT consistent"); n == "0" {
		t.Fatal("the transaction was applied whole: the test proves nothing")
	}
	// Applied in parts, it is all there, once.
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
	assertLakeExactlyOnce(t, h.cfg, "public.t")
	files := queryText(t, h.cfg.Warehouse.Path, "SELECT string_agg(path, ',') FROM lakeflow.lake_files WHERE batch = (SELECT max(batch) FROM lakeflow.batches)")
	for _, f := range strings.Split(files, ",") {
		if err := os.Remove(filepath.Join(h.cfg.Lake.Dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	a, out := asofAtEnd(t, h)
	if !a.Split {
		t.Error("asof does not say the lake's last changes hold part of a transaction")
	}
	if n := queryText(t, out, "SELECT count(*) FROM silver.t WHERE NOT _deleted"); n != "10" {
		t.Errorf("asof holds %s rows of t, want the 10 from before the transaction", n)
	}
}
