package pipeline

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestTinyRetentionLosesNothing: with a retention far smaller than the
// backlog, Kafka is trimmed only below what the warehouse committed; a
// table idle for longer than the retention survives restarts.
func TestTinyRetentionLosesNothing(t *testing.T) {
	defer func(d time.Duration) { trimInterval = d }(trimInterval)
	trimInterval = 50 * time.Millisecond
	h := newHarnessWith(t, "retention = \"1ms\"\nretention_bytes = \"1B\"", qualified(demoTables)...)
	ctx := context.Background()
	if err := demo.Setup(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, h.dsn, `INSERT INTO orders (id, customer_id, status, total_cents, currency)
		SELECT g, 1 + g % 200, 'paid', g, 'EUR' FROM generate_series(100000, 130000) g`)
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		_, err := demo.Workload{Events: 8000, Seed: 3}.Run(ctx, dsn)
		return err
	}})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	assertLakeExactlyOnce(t, h.cfg, demoTables...)
	start, end := topicOffsets(t, h.cfg, "orders")
	if start == 0 || end-start > 1 {
		t.Fatalf("orders topic spans offsets %d..%d: lakeflow did not trim what the warehouse committed", start, end)
	}
	// Idle for longer than the retention, then restarted twice: the
	// partitions keep their last record and their offsets.
	time.Sleep(20 * time.Millisecond)
	h.run(t, Options{})
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		_, err := demo.Workload{Events: 500, Seed: 4}.Run(ctx, dsn)
		return err
	}})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	assertLakeExactlyOnce(t, h.cfg, demoTables...)
}

// topicOffsets starts the stopped pipeline's broker and returns the start
// and end offsets of a table's topic, checking that the topic keeps its
// records until lakeflow trims them (no retention of its own).
func topicOffsets(t *testing.T, cfg *config.Config, table string) (int64, int64) {
	t.Helper()
	b, err := kafka.StartBroker(cfg.Kafka.Dir, cfg.Kafka.Listen, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := kafka.TableTopic(cfg.Kafka.TopicPrefix, "public", table)
	ctx := context.Background()
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := starts.Lookup(topic, 0)
	e, _ := ends.Lookup(topic, 0)
	configs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := configs.On(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rc.Configs {
		if (c.Key == "retention.ms" || c.Key == "retention.bytes") && (c.Value == nil || *c.Value != "-1") {
			t.Fatalf("topic %s has %s = %v: the broker would delete records the warehouse has not read", topic, c.Key, c.MaybeValue())
		}
	}
	return s.Offset, e.Offset
}

// TestKafkaLossResumes deletes the Kafka data between two runs, and then
// changes the topic prefix: the pipeline resumes from the WAL, loses
// nothing and writes nothing twice to the lake.
func TestKafkaLossResumes(t *testing.T) {
	h := newDemoHarness(t)
	workload := func(seed uint64) Options { return demoWorkload(demo.Workload{Events: 3000, Seed: seed}) }
	h.run(t, workload(1))
	if err := os.RemoveAll(h.cfg.Kafka.Dir); err != nil {
		t.Fatal(err)
	}
	h.run(t, workload(2))
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	assertLakeMatchesSilver(t, h.cfg, demoTables...)

	h.cfg.Kafka.TopicPrefix = "renamed"
	h.run(t, workload(3))
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	assertLakeMatchesSilver(t, h.cfg, demoTables...)
}

// assertLakeMatchesSilver checks, for lakes whose Kafka offsets restarted,
// that no event is in the lake twice and that the newest event of every
// key in the lake is what silver holds for it.
func assertLakeMatchesSilver(t *testing.T, cfg *config.Config, tables ...string) {
	t.Helper()
	db := openDuck(t, cfg.Warehouse.Path)
	defer db.Close()
	for _, table := range tables {
		glob := filepath.Join(cfg.Lake.Dir, table, "*", "*.parquet")
		keys := []string{"id"}
		if table == "order_items" {
			keys = []string{"order_id", "line_no"}
		}
		var lakeKeys []string
		for _, k := range keys {
			lakeKeys = append(lakeKeys, "COALESCE(after, before)."+k+" AS "+k)
		}
		var dups, differ int64
		queryRow(t, db, `SELECT count(*) FROM (SELECT _cdc_seq, _cdc_ord, CASE WHEN _cdc_ord = 0 THEN after::VARCHAR END
			FROM read_parquet(?, union_by_name = true) GROUP BY ALL HAVING count(*) > 1)`, &dups, glob)
		queryRow(t, db, `WITH lake AS (
				SELECT `+strings.Join(lakeKeys, ", ")+`, _cdc_seq, _cdc_ord, op = 'd' AS deleted FROM read_parquet(?, union_by_name = true)
				QUALIFY row_number() OVER (PARTITION BY `+strings.Join(keys, ", ")+` ORDER BY _cdc_seq DESC, _cdc_ord DESC) = 1)
			SELECT count(*) FROM lake FULL JOIN silver.`+table+` s USING (`+strings.Join(keys, ", ")+`)
			WHERE lake._cdc_seq IS DISTINCT FROM s._cdc_seq OR lake._cdc_ord IS DISTINCT FROM s._cdc_ord OR lake.deleted IS DISTINCT FROM s._deleted`,
			&differ, glob)
		if dups != 0 || differ != 0 {
			t.Errorf("lake %s: %d events repeat, %d keys differ from silver", table, dups, differ)
		}
	}
}
