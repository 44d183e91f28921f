package pipeline

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestDeadLettersLeaveTheRestAlone: rows whose values silver cannot hold
// (numeric NaN in numeric(10,2), a timestamp beyond DuckDB's range) and
// garbage another producer writes to a table topic go to the dead-letter
// queue; the good events around them are applied, and the lake plus the
// dead letters account for every Kafka record.
func TestDeadLettersLeaveTheRestAlone(t *testing.T) {
	h := newHarness(t, "public.readings")
	pgtest.Exec(t, h.dsn, `CREATE TABLE readings (id int PRIMARY KEY, amount numeric(10,2), at timestamp, note text)`,
		`ALTER TABLE readings REPLICA IDENTITY FULL`,
		`INSERT INTO readings VALUES (1, 1.50, '2024-01-01 10:00', 'good'), (2, 'NaN', '2024-01-01', 'nan')`)
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`INSERT INTO readings VALUES (3, 3, '294276-12-31 23:59:59', 'far future')`},
			{`INSERT INTO readings VALUES (4, 4.25, '2024-02-29 12:00', 'good')`},
			{`UPDATE readings SET note = 'still good' WHERE id = 1`},
		})
	}})
	writeGarbage(t, h, "readings", [][]byte{[]byte("not json"), []byte(`{"op":"c"}`), {0xff, 0xfe, 0x00},
		[]byte(`{"before":null,"after":{"id":9,"amount":"abc","at":1,"note":"x"},"op":"c","_cdc_seq":1,"_cdc_ord":1,"_commit_ts":"2024-01-01T00:00:00Z"}`)})
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{{`INSERT INTO readings VALUES (5, 5, '2024-03-01', 'after the garbage')`},
			{`DELETE FROM readings WHERE id IN (2, 3)`}})
	}})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "readings")
	db := openDuck(t, h.cfg.Warehouse.Path)
	defer db.Close()
	var dead, lakeEvents, records, lakeDead int64
	var reasons string
	queryRow(t, db, `SELECT count(*) FROM lakeflow.dlq`, &dead)
	queryRow(t, db, `SELECT string_agg(failure_reason, ' | ' ORDER BY "offset") FROM lakeflow.dlq`, &reasons)
	queryRow(t, db, `SELECT count(*) FROM read_parquet(?)`, &lakeEvents, h.cfg.Lake.Dir+"/readings/*/*.parquet")
	queryRow(t, db, `SELECT count(*) FROM read_parquet(?)`, &lakeDead, h.cfg.Lake.Dir+"/_dlq/*/*/*.parquet")
	queryRow(t, db, `SELECT sum(next_offset) FROM lakeflow.offsets WHERE topic LIKE '%.public.readings'`, &records)
	// NaN and the far timestamp: their insert, and their delete (whose
	// old row holds the same values); four pieces of garbage.
	if dead != 8 || lakeDead != dead || lakeEvents+dead != records {
		t.Fatalf("%d dead letters (%d in the lake), %d lake events, %d Kafka records; reasons: %s", dead, lakeDead, lakeEvents, records, reasons)
	}
	for _, want := range []string{"after.amount = NaN does not fit DECIMAL(10,2)", "after.at = 294276-12-31 23:59:59 does not fit TIMESTAMP",
		"not a JSON envelope", "_cdc_seq or _cdc_ord is missing", "after.amount = abc does not fit DECIMAL(10,2)"} {
		if !strings.Contains(reasons, want) {
			t.Errorf("no dead letter says %q: %s", want, reasons)
		}
	}
}

// writeGarbage writes records to a table's topic of the stopped pipeline
// with a plain Kafka producer.
func writeGarbage(t *testing.T, h *harness, table string, values [][]byte) {
	t.Helper()
	withBroker(t, h, func(cl *kgo.Client) {
		for _, v := range values {
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: kafka.TableTopic(h.cfg.Kafka.TopicPrefix, "public", table), Value: v}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// withBroker starts the stopped pipeline's embedded broker and hands a
// plain Kafka client of it to f.
func withBroker(t *testing.T, h *harness, f func(cl *kgo.Client)) {
	t.Helper()
	b, err := kafka.StartBroker(h.cfg.Kafka.Dir, h.cfg.Kafka.Listen, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	f(cl)
}

// TestTransactionsAreNeverSplit: with a batch limit smaller than a
// transaction (an order with its items and payment), every transaction is
// still applied in one warehouse commit.
func TestTransactionsAreNeverSplit(t *testing.T) {
	h := newHarness(t, qualified(demoTables)...)
	h.cfg.Pipeline.BatchEvents = 2
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		_, err := demo.Workload{Events: 600, Seed: 9}.Run(ctx, dsn)
		return err
	}})
	db := openDuck(t, h.cfg.Warehouse.Path)
	defer db.Close()
	var split, multi, batches, inconsistent int64
	queryRow(t, db, `WITH events AS (
			SELECT e._cdc_seq, f.batch, f.source_table FROM read_parquet(?, filename = true) e
			JOIN lakeflow.lake_files f ON e.filename = ? || '/' || f.path WHERE e._cdc_ord > 0)
		SELECT count(*) FROM (SELECT _cdc_seq FROM events GROUP BY ALL HAVING count(DISTINCT batch) > 1)`,
		&split, h.cfg.Lake.Dir+"/*/*/*.parquet", h.cfg.Lake.Dir)
	queryRow(t, db, `SELECT count(*) FROM (SELECT _cdc_seq FROM read_parquet(?) WHERE _cdc_ord > 0 GROUP BY ALL HAVING count(*) > 2)`,
		&multi, h.cfg.Lake.Dir+"/*/*/*.parquet")
	queryRow(t, db, `SELECT count(*) FROM lakeflow.batches`, &batches)
	queryRow(t, db, `SELECT count(*) FROM lakeflow.batches WHERE NOT consistent AND events > 0`, &inconsistent)
	if split != 0 || inconsistent != 0 || multi == 0 || batches < 2 {
		t.Fatalf("%d transactions split across commits, %d inconsistent batches of %d, %d transactions of more than 2 events", split, inconsistent, batches, multi)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
}
