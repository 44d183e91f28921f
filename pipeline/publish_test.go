package pipeline

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestPublishedWarehouseWhileRunning: while lakeflow run --follow
// ingests a steady workload, other processes open warehouse.path
// read-only — this one holds it open throughout (DuckDB's Go client
// directly), another (lakeflow sql) opens it again and again, and so
// does Node.js's DuckDB client — without a lock error, each sees one committed batch whole (every order's total
// is its lines', every day of gold.daily_revenue silver's), and newer
// ones as they are published, while the pipeline keeps applying.
func TestPublishedWarehouseWhileRunning(t *testing.T) {
	h := newHarnessWith(t, "\n[warehouse]\npublish_interval = \"300ms\"", qualified(demoTables)...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := demo.Setup(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	p := start(t, h, "run", "--follow", "--metrics-addr", fmt.Sprintf(":%d", port))
	defer p.kill(t)
	load := make(chan error, 1)
	go func() {
		_, err := demo.Workload{Events: 1_000_000, Seed: 71, Clean: true, Rate: 3000}.Run(ctx, h.dsn)
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		load <- err
	}()
	p.waitBatches(t, 2)
	// A copy of a batch (the first, made as the run starts, may hold no
	// table yet).
	for deadline := time.Now().Add(time.Minute); !publishedBatch(h.cfg.Warehouse.Path); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no batch published in a minute")
		}
	}
	// A reader that holds the published file open throughout.
	held, err := sql.Open("duckdb", h.cfg.Warehouse.Path+"?access_mode=READ_ONLY")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	held.SetMaxOpenConns(1)
	const torn = `SELECT count(*) FROM (SELECT o.id FROM silver.orders o JOIN silver.order_items i ON i.order_id = o.id AND NOT i._deleted
		WHERE NOT o._deleted GROUP BY o.id, o.total_cents HAVING o.total_cents <> sum(i.quantity * i.unit_price_cents))`
	// Gold as of the copy's silver: the run refreshes the marts before
	// each copy, not with each batch (warehouse.DeferGold).
	const days = `SELECT lakeflow_utc_date(created_at), count(*) FROM silver.orders WHERE NOT _deleted GROUP BY ALL`
	const stale = `SELECT count(*) FROM ((SELECT order_date, orders FROM gold.daily_revenue EXCEPT ALL ` + days + `)
		UNION ALL (` + days + ` EXCEPT ALL SELECT order_date, orders FROM gold.daily_revenue))`
	var heldBatch, bad int
	queryRow(t, held, "SELECT batch FROM lakeflow.published", &heldBatch)
	// lakeflow sql, its own process, opening the newest copy each time,
	// twenty times a second or more apart, while the first reader holds
	// its copy. (A count, not a span of time: a slow machine reads less
	// often.)
	applied := metric(t, metricsURL, "lakeflow_events_applied_total")
	var batches []int
	busiest := int64(0)
	for len(batches) < 20 {
		time.Sleep(time.Second)
		out, err := lakeflowCmd(t, "--config", h.file, "sql", "--format", "csv",
			"SELECT (SELECT batch FROM lakeflow.published), ("+torn+"), ("+stale+")").CombinedOutput()
		if err != nil {
			t.Fatalf("lakeflow sql while the pipeline runs: %v\n%s", err, out)
		}
		fields := strings.Split(strings.Split(strings.TrimSpace(string(out)), "\n")[1], ",")
		b, _ := strconv.Atoi(fields[0])
		if fields[1] != "0" {
			t.Fatalf("published batch %d holds orders whose total is not their lines': %s", b, fields[1])
		}
		if fields[2] != "0" {
			t.Fatalf("published batch %d holds gold.daily_revenue days whose orders are not silver's: %s", b, fields[2])
		}
		batches = append(batches, b)
		if st := status(t, h); st.Slot != nil {
			busiest = max(busiest, st.Slot.LagBytes)
		}
	}
	if busiest == 0 {
		t.Error("lakeflow status saw the slot at the WAL's end all through a steady workload")
	}
	// Node.js's DuckDB client, which the README names for a machine
	// without duckdb, reads a copy as whole.
	if got, want := nodeQuery(t, h.cfg.Warehouse.Path, "SELECT ("+torn+")::INT, (SELECT batch FROM lakeflow.published) >= "+strconv.Itoa(heldBatch)), "[[0,true]]"; got != want {
		t.Errorf("node's DuckDB client read %s (torn orders, a copy at least as new as the held one), want %s", got, want)
	}
	assertMetrics(t, metricsURL)
	assertDashboardMetricsExist(t, metricsURL)
	if now := metric(t, metricsURL, "lakeflow_events_applied_total"); now <= applied {
		t.Errorf("the pipeline applied nothing while the copy was held (%v events before, %v after)", applied, now)
	}
	queryRow(t, held, torn, &bad)
	var still int
	queryRow(t, held, "SELECT batch FROM lakeflow.published", &still)
	if bad != 0 || still != heldBatch {
		t.Errorf("the held copy changed under its reader (batch %d → %d) or is torn (%d)", heldBatch, still, bad)
	}
	// Opened again, it is a newer copy, as consistent.
	held.Close()
	again := openDuck(t, h.cfg.Warehouse.Path)
	queryRow(t, again, "SELECT batch FROM lakeflow.published", &still)
	queryRow(t, again, torn, &bad)
	again.Close()
	if still <= heldBatch || bad != 0 {
		t.Errorf("reopened after 20 reads, the published copy is batch %d (was %d), torn %d", still, heldBatch, bad)
	}
	if batches[len(batches)-1] <= batches[0] {
		t.Errorf("published batches seen by lakeflow sql %v: want newer ones over 20 reads", batches)
	}
	for i := 1; i < len(batches); i++ {
		if batches[i] < batches[i-1] {
			t.Errorf("published batches went back: %v", batches)
		}
	}
	cancel()
	if err := <-load; err != nil {
		t.Fatal(err)
	}
	// lakeflow status, beside the run: its lags go to zero once the
	// workload stops and the pipeline catches up.
	var st StatusReport
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		st = status(t, h)
		lag := int64(0)
		for _, tl := range st.Topics {
			lag += tl.Lag
		}
		// Every table topic, and the watermark topic.
		if st.Slot != nil && st.Slot.LagBytes < 64<<10 && len(st.Topics) == len(demoTables)+1 && lag == 0 && st.Published != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lakeflow status did not settle at zero lag in a minute: %+v", st)
		}
	}
	if st.LastBatch == nil || st.Held.Quarantined != 0 || len(st.Lake) != len(demoTables) || len(st.Datasets) != len(demoTables) {
		t.Errorf("lakeflow status: %+v", st)
	}
}

// status runs lakeflow status --json.
func status(t *testing.T, h *harness) StatusReport {
	t.Helper()
	out, err := withStderr(lakeflowCmd(t, "--config", h.file, "status", "--json").Output())
	var st StatusReport
	if err == nil {
		err = json.Unmarshal(out, &st)
	}
	if err != nil {
		t.Fatalf("lakeflow status --json: %v\n%s", err, out)
	}
	return st
}

// assertMetrics scrapes the metrics endpoint, parsed as Prometheus's
// text format, and checks batches were counted and timed, and where the
// process's memory is (Go heap, DuckDB, resident) reported.
func assertMetrics(t *testing.T, url string) {
	t.Helper()
	for _, name := range []string{"lakeflow_events_applied_total", "lakeflow_batches_total", "lakeflow_batch_duration_seconds",
		"lakeflow_freshness_seconds", "lakeflow_published_timestamp_seconds", "lakeflow_consistent_cdc_seq",
		"lakeflow_duckdb_memory_bytes", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes", "lakeflow_published_copy_age_seconds"} {
		if v := metric(t, url, name); v <= 0 {
			t.Errorf("%s is %v while batches commit", name, v)
		}
	}
}

// scrape reads every metric family served at url.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the metrics do not parse: %v", err)
	}
	return families
}

// metric scrapes one metric (a histogram's sample count).
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	f := scrape(t, url)[name]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("no metric %s", name)
	}
	m := f.GetMetric()[0]
	if h := m.GetHistogram(); h != nil {
		return float64(h.GetSampleCount())
	}
	return m.GetCounter().GetValue() + m.GetGauge().GetValue()
}

// publishedBatch says whether the copy at path holds a batch.
func publishedBatch(path string) bool {
	if _, err := os.Stat(path); err != nil {
		return false
	}
	db, err := sql.Open("duckdb", path+"?access_mode=READ_ONLY")
	if err != nil {
		return false
	}
	defer db.Close()
	var batch int
	return db.QueryRow("SELECT batch FROM lakeflow.published").Scan(&batch) == nil && batch > 0
}
