package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/warehouse"
)

// metrics are what lakeflow run exposes to Prometheus (Options.MetricsAddr):
// names with the lakeflow_ prefix, base units, _total counters.
type metrics struct {
	reg                                             *prometheus.Registry
	events, batches, files, quarantined, dead       prometheus.Counter
	batchSeconds, freshness                         prometheus.Histogram
	lastBatch, consistentSeq, pending, publish, sla prometheus.Gauge
	lag                                             *prometheus.GaugeVec
	lagTopics                                       map[string]bool // the topics lag has a series of
	// published is when warehouse.path was last published (Unix ns; 0:
	// not by this run), set by the publisher's goroutine.
	published atomic.Int64
}

func newMetrics(wh *warehouse.Warehouse) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), lagTopics: map[string]bool{}}
	// Where the process's memory is: the Go heap (go_memstats_*), DuckDB
	// (lakeflow_duckdb_*), the whole (process_resident_memory_bytes).
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), duckdbMemory{
		wh:       wh,
		inMemory: prometheus.NewDesc("lakeflow_duckdb_memory_bytes", "Memory DuckDB's buffer manager holds (the warehouse's blocks, a batch's working set).", nil, nil),
		spilled:  prometheus.NewDesc("lakeflow_duckdb_spilled_bytes", "What DuckDB spilled to temporary files.", nil, nil),
	})
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "lakeflow_" + name, Help: help})
		m.reg.MustRegister(c)
		return c
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "lakeflow_" + name, Help: help})
		m.reg.MustRegister(g)
		return g
	}
	histogram := func(name, help string) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lakeflow_" + name, Help: help,
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60}})
		m.reg.MustRegister(h)
		return h
	}
	m.events = counter("events_applied_total", "Change events applied to the warehouse.")
	m.batches = counter("batches_total", "Batches committed.")
	m.files = counter("lake_files_total", "Lake files written.")
	m.quarantined = counter("quarantined_total", "Changes held back by contract rules.")
	m.dead = counter("dead_letters_total", "Events sent to the dead-letter queue.")
	m.batchSeconds = histogram("batch_duration_seconds", "Time to apply one batch (stage to commit).")
	m.freshness = histogram("freshness_seconds", "Source commit of a batch's newest transaction to its silver commit.")
	m.lastBatch = gauge("last_batch_timestamp_seconds", "When the last batch committed (Unix time).")
	m.consistentSeq = gauge("consistent_cdc_seq", "The source position (_cdc_seq) of the last consistent batch.")
	m.pending = gauge("pending_events", "Events consumed from Kafka and not yet applied.")
	m.publish = gauge("published_timestamp_seconds", "When warehouse.path was last published (Unix time).")
	m.sla = gauge("freshness_sla_seconds", "The tightest freshness a contract asks of its table (0: none asks).")
	m.lag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lakeflow_kafka_consumer_lag_records", Help: "Records Kafka holds past where the consumer stands, per topic."}, []string{"topic"})
	m.reg.MustRegister(m.lag, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lakeflow_published_copy_age_seconds",
		Help: "Seconds since warehouse.path was last published, by this run or before it (what readers see is that much older than the warehouse)."}, func() float64 {
		if at := m.published.Load(); at != 0 {
			return time.Since(time.Unix(0, at)).Seconds()
		}
		return math.NaN()
	}))
	// Where the warehouse stands from the start, not from the first batch
	// of this run.
	m.consistentSeq.Set(float64(wh.Floor()))
	return m
}

// batch records a batch that committed at `at` and its watermark (nil: it
// did not end at one).
func (m *metrics) batch(st warehouse.BatchStats, wm *change.Watermark, took time.Duration, at time.Time) {
	m.events.Add(float64(st.Events))
	m.batches.Inc()
	m.files.Add(float64(st.LakeFiles))
	m.quarantined.Add(float64(st.Quarantined))
	m.batchSeconds.Observe(took.Seconds())
	m.lastBatch.Set(float64(at.UnixNano()) / 1e9)
	if wm != nil {
		m.consistentSeq.Set(float64(wm.Seq))
		if wm.Commit > 0 {
			m.freshness.Observe(at.Sub(time.UnixMicro(wm.Commit)).Seconds())
		}
	}
}

// lagged sets the Kafka lag of each topic read; a topic read no more
// (its log reset) leaves no series behind.
func (m *metrics) lagged(lag map[string]int64) {
	for topic := range m.lagTopics {
		if _, ok := lag[topic]; !ok {
			m.lag.DeleteLabelValues(topic)
			delete(m.lagTopics, topic)
		}
	}
	for topic, n := range lag {
		m.lag.WithLabelValues(topic).Set(float64(n))
		m.lagTopics[topic] = true
	}
}

// copied records a copy published now.
func (m *metrics) copied() {
	m.publish.SetToCurrentTime()
	m.published.Store(time.Now().UnixNano())
}

// contracts records what the contracts ask: the tightest freshness.
func (m *metrics) contracts(set contracts.Set) {
	var tightest time.Duration
	for _, c := range set {
		if c.Freshness > 0 && (tightest == 0 || c.Freshness < tightest) {
			tightest = c.Freshness
		}
	}
	m.sla.Set(tightest.Seconds())
}

// source reports, at each scrape, the WAL the replication slot holds:
// from the position last confirmed to the server's end.
func (m *metrics) source(st *postgres.Stats) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lakeflow_slot_lag_bytes",
		Help: "WAL bytes the replication slot holds: the server's end past the position lakeflow last confirmed."}, func() float64 {
		wal, confirmed := st.ServerWAL.Load(), st.Confirmed.Load()
		if confirmed == 0 || wal < confirmed {
			return 0
		}
		return float64(wal - confirmed)
	}))
}

// duckdbMemory reports DuckDB's memory at each scrape.
type duckdbMemory struct {
	wh                *warehouse.Warehouse
	inMemory, spilled *prometheus.Desc
}

func (d duckdbMemory) Describe(ch chan<- *prometheus.Desc) {
	ch <- d.inMemory
	ch <- d.spilled
}

func (d duckdbMemory) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	inMemory, spilled, err := d.wh.Memory(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(d.inMemory, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(d.inMemory, prometheus.GaugeValue, float64(inMemory))
	ch <- prometheus.MustNewConstMetric(d.spilled, prometheus.GaugeValue, float64(spilled))
}

// listenMetrics opens the metrics endpoint's address (a port alone binds
// loopback) before the run starts anything, so that a mistake in it is
// said at once.
func listenMetrics(addr string) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: --metrics-addr %q: want host:port, or :port for loopback", fault.ErrConfig, addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, fmt.Errorf("%w: --metrics-addr %s: %v", fault.ErrEnvironment, addr, err)
	}
	return ln, nil
}

// serve exposes the metrics on ln under /metrics until ctx ends.
func (m *metrics) serve(ctx context.Context, ln net.Listener, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics endpoint stopped", "err", err)
		}
	}()
	log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
}

// parkedCollector reports, at each scrape, whether each captured table
// (tables) is parked for a change of its shape (lakeflow_table_parked 1,
// else 0: the series exists before a table is parked, for alerts and
// dashboards to name) and since when a parked one is
// (lakeflow_table_parked_since_timestamp_seconds).
func parkedCollector(list func() []change.ParkedTable, tables []string) prometheus.Collector {
	return parked{list: list, tables: tables,
		parked: prometheus.NewDesc("lakeflow_table_parked", "Whether a table's change of shape waits for a contract edit or a resync (1; its changes wait in the WAL) or not (0).", []string{"table"}, nil),
		since:  prometheus.NewDesc("lakeflow_table_parked_since_timestamp_seconds", "When the table was parked (Unix time).", []string{"table"}, nil)}
}

type parked struct {
	list          func() []change.ParkedTable
	tables        []string
	parked, since *prometheus.Desc
}

func (p parked) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.parked
	ch <- p.since
}

func (p parked) Collect(ch chan<- prometheus.Metric) {
	held := map[string]bool{}
	for _, t := range p.list() {
		held[t.Table] = true
		ch <- prometheus.MustNewConstMetric(p.parked, prometheus.GaugeValue, 1, t.Table)
		ch <- prometheus.MustNewConstMetric(p.since, prometheus.GaugeValue, float64(t.Since)/1e6, t.Table)
	}
	for _, t := range p.tables {
		if !held[t] {
			ch <- prometheus.MustNewConstMetric(p.parked, prometheus.GaugeValue, 0, t)
		}
	}
}
