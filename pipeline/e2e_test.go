package pipeline

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

var allTables = []string{"customers", "products", "orders", "order_items", "payments", "typed", "scratch"}

func qualified(tables []string) []string {
	out := make([]string, len(tables))
	for i, t := range tables {
		out[i] = "public." + t
	}
	return out
}

// TestEndToEnd runs a snapshot plus a mixed workload of more than 20,000
// changes through WAL → Kafka → lake + warehouse and compares every
// silver table with its source table row by row; then proves that a rerun
// is a no-op and that a second consumer rebuilds an identical warehouse.
func TestEndToEnd(t *testing.T) {
	h := newHarness(t, qualified(allTables)...)
	ctx := context.Background()
	if err := demo.Setup(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, h.dsn, typedDDL, typedRow("1", 0), typedRow("2", 1), typedRow("3", 2))
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		if err := typedChanges(ctx, dsn); err != nil {
			return err
		}
		_, err := demo.Workload{Events: 21000, Seed: 7}.Run(ctx, dsn)
		return err
	}})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, allTables...)
	assertSilverTypes(t, h.cfg.Warehouse.Path, "typed", typedSilverTypes)
	assertLakeSchema(t, h.cfg, "orders", ordersLakeSchema)
	first := lakeCounts(t, h.cfg)
	assertLakeExactlyOnce(t, h.cfg, allTables...)
	assertKcatReads(t, h.cfg, "orders", consumed(t, h.cfg, "orders"))

	// A run with nothing new changes nothing.
	h.run(t, Options{})
	if again := lakeCounts(t, h.cfg); again != first {
		t.Fatalf("rerun changed the lake or warehouse: %+v, before %+v", again, first)
	}
	assertLakeExactlyOnce(t, h.cfg, allTables...)

	// A second consumer from offset 0 into a fresh warehouse and lake.
	fresh := *h.cfg
	fresh.Warehouse.Path = filepath.Join(h.dir, "rebuild", "warehouse.duckdb")
	fresh.Warehouse.Live = filepath.Join(h.dir, "rebuild", "live.duckdb")
	fresh.Lake.Dir = filepath.Join(h.dir, "rebuild", "lake")
	if err := runWatched(t, &fresh, Options{}, h.log); err != nil {
		t.Fatal(err)
	}
	assertSameSilver(t, h.cfg.Warehouse.Path, fresh.Warehouse.Path, allTables...)
	assertLakeExactlyOnce(t, &fresh, allTables...)
}

// typedSilverTypes are the DuckDB types silver.typed must have.
const typedSilverTypes = `id INTEGER, i2 SMALLINT, i8 BIGINT, f4 FLOAT, f8 DOUBLE, n DECIMAL(14,3), nu VARCHAR,
m DECIMAL(19,2), b BOOLEAN, t VARCHAR, vc VARCHAR, ch VARCHAR, by BLOB, d DATE, tm TIME,
ttz TIME WITH TIME ZONE, ts TIMESTAMP, tstz TIMESTAMP WITH TIME ZONE, iv INTERVAL, u UUID, j JSON, jb JSON,
ia INTEGER[], ta VARCHAR[], e VARCHAR, dom INTEGER, big VARCHAR, _cdc_seq UBIGINT, _cdc_ord UINTEGER,
_commit_ts TIMESTAMP WITH TIME ZONE, _deleted BOOLEAN`

// assertSilverTypes checks the declared column types of a silver table.
func assertSilverTypes(t *testing.T, warehouse, table, want string) {
	t.Helper()
	db := openDuck(t, warehouse)
	defer db.Close()
	var got string
	queryRow(t, db, `SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER BY ordinal_position)
		FROM information_schema.columns WHERE table_schema = 'silver' AND table_name = ?`, &got, table)
	if norm := strings.Join(strings.Fields(want), " "); got != norm {
		t.Fatalf("silver.%s types:\n got %s\nwant %s", table, got, norm)
	}
}

// ordersLakeSchema is the shape of the orders lake files (date is the
// hive partition of the path).
const ordersLakeSchema = `op VARCHAR,
before STRUCT(id BIGINT, customer_id BIGINT, status VARCHAR, total_cents BIGINT, currency VARCHAR, created_at TIMESTAMP WITH TIME ZONE, updated_at TIMESTAMP WITH TIME ZONE),
after STRUCT(id BIGINT, customer_id BIGINT, status VARCHAR, total_cents BIGINT, currency VARCHAR, created_at TIMESTAMP WITH TIME ZONE, updated_at TIMESTAMP WITH TIME ZONE),
_cdc_seq UBIGINT, _cdc_ord UINTEGER, _commit_ts TIMESTAMP WITH TIME ZONE, lsn UBIGINT, tx_id UBIGINT,
kafka_topic VARCHAR, kafka_partition INTEGER, kafka_offset BIGINT, date DATE`

func assertLakeSchema(t *testing.T, cfg *config.Config, table, want string) {
	t.Helper()
	db := openDuck(t, cfg.Warehouse.Path)
	defer db.Close()
	var got string
	queryRow(t, db, `SELECT string_agg(column_name || ' ' || column_type, ', ')
		FROM (DESCRIBE SELECT * FROM read_parquet(?))`, &got, filepath.Join(cfg.Lake.Dir, table, "*", "*.parquet"))
	if norm := strings.Join(strings.Fields(want), " "); got != norm {
		t.Fatalf("lake %s schema:\n got %s\nwant %s", table, got, norm)
	}
}

type counts struct {
	lakeEvents, consumed, silverRows int64
}

// lakeCounts reads how many events the lake holds, how many records the
// warehouse consumed and how many silver rows exist.
func lakeCounts(t *testing.T, cfg *config.Config) counts {
	t.Helper()
	db := openDuck(t, cfg.Warehouse.Path)
	defer db.Close()
	var c counts
	queryRow(t, db, "SELECT count(*) FROM read_parquet(?, union_by_name = true)", &c.lakeEvents, filepath.Join(cfg.Lake.Dir, "*", "*", "*.parquet"))
	queryRow(t, db, "SELECT sum(next_offset) FROM lakeflow.offsets WHERE topic NOT LIKE '%._schemas' AND topic NOT LIKE '%._watermarks'", &c.consumed)
	queryRow(t, db, `SELECT (SELECT count(*) FROM silver.orders) + (SELECT count(*) FROM silver.order_items)
		+ (SELECT count(*) FROM silver.customers) + (SELECT count(*) FROM silver.typed)`, &c.silverRows)
	return c
}

// assertLakeExactlyOnce checks that every consumed Kafka record is in the
// lake exactly once (as an event, or a dead letter of a table topic), and
// that no event position repeats.
func assertLakeExactlyOnce(t *testing.T, cfg *config.Config, tables ...string) {
	t.Helper()
	db := openDuck(t, cfg.Warehouse.Path)
	defer db.Close()
	var records int64
	queryRow(t, db, "SELECT sum(next_offset) FROM lakeflow.offsets WHERE topic NOT LIKE '%._schemas' AND topic NOT LIKE '%._watermarks'", &records)
	var events int64
	if dead, _ := filepath.Glob(filepath.Join(cfg.Lake.Dir, "_dlq", "*", "*", "*.parquet")); len(dead) > 0 {
		queryRow(t, db, "SELECT count(*) FROM read_parquet(?) WHERE NOT contains(topic, '._')", &events, filepath.Join(cfg.Lake.Dir, "_dlq", "*", "*", "*.parquet"))
	}
	for _, table := range tables {
		ct, err := config.ParseTable(table)
		if err != nil {
			t.Fatal(err)
		}
		glob := filepath.Join(cfg.Lake.Dir, change.SafeName(ct.Name), "*", "*.parquet")
		if files, _ := filepath.Glob(glob); len(files) == 0 {
			continue // an empty table nothing changed
		}
		var n, dupOffsets, dupPositions int64
		queryRow(t, db, "SELECT count(*) FROM read_parquet(?, union_by_name = true)", &n, glob)
		queryRow(t, db, `SELECT count(*) FROM (SELECT kafka_partition, kafka_offset FROM read_parquet(?, union_by_name = true)
			GROUP BY ALL HAVING count(*) > 1)`, &dupOffsets, glob)
		// Stream events are unique by (_cdc_seq, _cdc_ord) within a
		// partition (a truncate sits in every partition); snapshot rows
		// share (consistent point, 0) and are unique by row.
		queryRow(t, db, `SELECT count(*) FROM (SELECT kafka_partition, _cdc_seq, _cdc_ord, CASE WHEN _cdc_ord = 0 THEN after::VARCHAR END
			FROM read_parquet(?, union_by_name = true) GROUP BY ALL HAVING count(*) > 1)`, &dupPositions, glob)
		if dupOffsets != 0 || dupPositions != 0 {
			t.Errorf("lake %s: %d offsets and %d positions repeat", table, dupOffsets, dupPositions)
		}
		events += n
	}
	if events != records {
		t.Fatalf("lake holds %d events for %d consumed records", events, records)
	}
}

// assertSameSilver checks two warehouses hold identical silver tables,
// positions included: the same columns, by name (a table rebuilt from its
// newest schema has the columns added since before lakeflow's own), and
// the same rows.
func assertSameSilver(t *testing.T, a, b string, tables ...string) {
	t.Helper()
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, stmt := range []string{"ATTACH '" + a + "' AS a (READ_ONLY)", "ATTACH '" + b + "' AS b (READ_ONLY)"} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range tables {
		columns := func(side string) string {
			var cols string
			queryRow(t, db, "SELECT string_agg('\"' || replace(column_name, '\"', '\"\"') || '\"', ', ' ORDER BY column_name) FROM information_schema.columns WHERE table_catalog = ? AND table_schema = 'silver' AND table_name = ?", &cols, side, table)
			return cols
		}
		cols := columns("a")
		if other := columns("b"); other != cols {
			t.Errorf("silver.%s has the columns %s in %s, %s in %s", table, cols, a, other, b)
			continue
		}
		sa, sb := "(SELECT "+cols+" FROM a.silver."+table+")", "(SELECT "+cols+" FROM b.silver."+table+")"
		var diff, n int64
		queryRow(t, db, "SELECT count(*) FROM ((FROM "+sa+" EXCEPT ALL FROM "+sb+") UNION ALL (FROM "+sb+" EXCEPT ALL FROM "+sa+"))", &diff)
		queryRow(t, db, "SELECT count(*) FROM a.silver."+table, &n)
		if diff != 0 || n == 0 {
			var sample string
			queryRow(t, db, "SELECT coalesce(string_agg(x::VARCHAR, '\n'), '') FROM (SELECT 'a' AS side, * FROM (FROM "+sa+" EXCEPT ALL FROM "+sb+") UNION ALL SELECT 'b', * FROM (FROM "+sb+" EXCEPT ALL FROM "+sa+") ORDER BY ALL LIMIT 6) x", &sample)
			t.Errorf("silver.%s: %d rows differ between %s and %s (%d rows):\n%s", table, diff, a, b, n, sample)
		}
	}
}

// consumed is how many records of a table's topic the warehouse read.
func consumed(t *testing.T, cfg *config.Config, table string) int64 {
	t.Helper()
	db := openDuck(t, cfg.Warehouse.Path)
	defer db.Close()
	var n int64
	queryRow(t, db, "SELECT sum(next_offset) FROM lakeflow.offsets WHERE topic = ?", &n, cfg.Kafka.TopicPrefix+".public."+table)
	return n
}

func queryRow(t *testing.T, db *sql.DB, query string, dst any, args ...any) {
	t.Helper()
	if err := db.QueryRow(query, args...).Scan(dst); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// queryText opens the DuckDB file at path, answers a query of one text
// value and closes it.
func queryText(t *testing.T, path, query string) string {
	t.Helper()
	db := openDuck(t, path)
	defer db.Close()
	var s string
	queryRow(t, db, query, &s)
	return s
}

// TestDrainRunConfirmsWhatItApplied: a run that drains the WAL stops its
// stream at the WAL's end, before the warehouse has applied everything;
// once it has, the slot is confirmed that far, so the next start does not
// decode that WAL again.
func TestDrainRunConfirmsWhatItApplied(t *testing.T) {
	h := newDemoHarness(t)
	ctx := context.Background()
	h.run(t, demoWorkload(demo.Workload{Events: 20000, Seed: 3}))
	var applied int64
	db := openDuck(t, h.cfg.Warehouse.Path)
	queryRow(t, db, "SELECT end_lsn::BIGINT FROM lakeflow.batches WHERE consistent ORDER BY batch DESC LIMIT 1", &applied)
	db.Close()
	conn := pgtest.Connect(t, h.dsn)
	defer conn.Close(ctx)
	var confirmed int64
	if err := conn.QueryRow(ctx, "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", h.cfg.Source.Slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	// Never past what the warehouse applied, and, once the run is done,
	// no longer behind it.
	if confirmed != applied {
		t.Fatalf("slot confirmed to %X after the run, the warehouse applied to %X", confirmed, applied)
	}
}

// TestCommitRightAfterTheDrainMarkerIsKept: a transaction open across a
// drain run whose commit record follows the drain marker directly has the
// marker's end LSN as its position; the next run applies it (it was
// dropped as already applied while boundaries took that LSN as theirs).
func TestCommitRightAfterTheDrainMarkerIsKept(t *testing.T) {
	h := newDemoHarness(t)
	ctx := context.Background()
	h.run(t, Options{})
	conn := pgtest.Connect(t, h.dsn)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO customers (id, email, name, country, segment) VALUES (9901, 'open@example.com', 'Open', 'FR', 'retail')`); err != nil {
		t.Fatal(err)
	}
	h.run(t, demoWorkload(demo.Workload{Events: 2000, Seed: 5}))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
}
