package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// InitialLoadResult measures lakeflow's initial load (the first run's
// snapshot: Kafka, lake and silver all written) against the source's own
// limit, COPY (SELECT …) TO STDOUT of the same tables into nothing.
type InitialLoadResult struct {
	Rows        int64     `json:"rows"`
	CopySeconds float64   `json:"copy_seconds"`
	CopyRate    float64   `json:"copy_rows_per_second"`
	Run         RunResult `json:"lakeflow_run"`
	Rate        float64   `json:"rows_per_second"`
	// Ratio is lakeflow's rate over COPY's (the target is ≥ 0.5).
	Ratio float64 `json:"ratio_to_copy"`
}

// initialTables are the tables the initial load copies, with how to fill
// them with their share of the rows ({n}): the demo's shapes, and one row of every type family
// lakeflow maps.
var initialTables = []struct {
	name, fill string
	share      float64
}{
	{"customers", `INSERT INTO customers SELECT g, 'c' || g || '@example.com', 'Customer ' || g, (ARRAY['DE','FR','US','JP'])[1 + g % 4],
		(ARRAY['retail','pro'])[1 + g % 2], now(), now() FROM generate_series(1000, 999 + {n}) g`, 0.2},
	{"orders", `INSERT INTO orders SELECT g, 1000 + g % 100000, (ARRAY['new','paid','shipped'])[1 + g % 3], g % 100000, 'EUR', now(), now()
		FROM generate_series(1, {n}) g`, 0.3},
	{"order_items", `INSERT INTO order_items SELECT 1 + g / 4, g % 4, 1 + g % 60, 1 + g % 5, 100 + g % 10000 FROM generate_series(1, {n}) g`, 0.3},
	{"typed", `INSERT INTO typed SELECT g, g % 32000, g * 1000, g / 7.0, g / 3.0, g / 1000.0, g::numeric / 7, (g % 10000)::money, g % 2 = 0,
		'text ' || g, 'vc' || g, 'ab', '\x00ff10', DATE '2024-01-01' + g % 1000, TIME '13:45:01.5', TIMETZ '10:00:00+05:30',
		TIMESTAMP '2024-02-29 23:59:59' + g * INTERVAL '1 second', TIMESTAMPTZ '2024-02-29 23:59:59+00' + g * INTERVAL '1 second',
		INTERVAL '1 day 02:00:00', md5(g::text)::uuid, '{"a": 1}', jsonb_build_object('g', g), ARRAY[g, g + 1], ARRAY['x', 'y'], 'ok', 1 + g % 100
		FROM generate_series(1, {n}) g`, 0.2},
}

const typedInitialDDL = `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE typed (
	id integer PRIMARY KEY, i2 smallint, i8 bigint, f4 real, f8 double precision,
	n numeric(14,3), nu numeric, m money, b boolean, t text, vc varchar(20), ch char(5), by bytea,
	d date, tm time, ttz timetz, ts timestamp, tstz timestamptz, iv interval,
	u uuid, j json, jb jsonb, ia integer[], ta text[], e mood, dom posint
)`

// initialOnly measures the initial load of rows rows and writes it into
// out's initial-load figures, keeping the rest of out.
func initialOnly(rows int, out, bin, profileDir string) error {
	ctx := context.Background()
	res, err := readResult(out, "-initial-only")
	if err != nil {
		return err
	}
	wb, err := newWorkbench(ctx, "lakeflow-bench-initial-", bin)
	if err != nil {
		return err
	}
	defer wb.close(false)
	work, bin, dsn := wb.work, wb.bin, wb.dsn
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	step("filling the demo's tables and a table of every type with %d rows", rows)
	if _, err := conn.Exec(ctx, "TRUNCATE customers, products, orders, order_items, payments; "+typedInitialDDL); err != nil {
		return err
	}
	var names []string
	for _, t := range initialTables {
		fill := strings.ReplaceAll(t.fill, "{n}", fmt.Sprint(int(float64(rows)*t.share)))
		if _, err := conn.Exec(ctx, fill); err != nil {
			return fmt.Errorf("fill %s: %v", t.name, err)
		}
		names = append(names, `"public.`+t.name+`"`)
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		return err
	}
	r := InitialLoadResult{}
	if err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM customers) + (SELECT count(*) FROM orders) + (SELECT count(*) FROM order_items) + (SELECT count(*) FROM typed)").Scan(&r.Rows); err != nil {
		return err
	}
	step("COPY (SELECT …) TO STDOUT of the same tables into nothing (the fastest of 3)")
	for range 3 {
		t0 := time.Now()
		for _, t := range initialTables {
			if _, err := conn.PgConn().CopyTo(ctx, io.Discard, "COPY (SELECT * FROM "+t.name+") TO STDOUT"); err != nil {
				return err
			}
		}
		if s := time.Since(t0).Seconds(); r.CopySeconds == 0 || s < r.CopySeconds {
			r.CopySeconds = s
		}
	}
	r.CopyRate = float64(r.Rows) / r.CopySeconds
	kafkaPort, err := freePort()
	if err != nil {
		return err
	}
	cfgFile := filepath.Join(work, "lakeflow-initial.toml")
	none := filepath.Join(work, "none")
	os.MkdirAll(none, 0o755)
	cfg := fmt.Sprintf("data_dir = \"data-initial\"\n[source]\ndsn = %q\nslot = \"bench_initial\"\ntables = [%s]\n[kafka]\nlisten = \"127.0.0.1:%d\"\n[contracts]\ndir = %q\n[gold]\ndir = %q\n",
		dsn, strings.Join(names, ", "), kafkaPort, none, none)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return err
	}
	step("lakeflow run: the initial load through Kafka into lake and silver")
	var flags []string
	if profileDir != "" {
		flags = []string{"--profile", profileDir}
	}
	if err := measure(bin, cfgFile, &r.Run, flags...); err != nil {
		return err
	}
	if profileDir != "" {
		cpu, err := stageCPU(filepath.Join(profileDir, "cpu.pprof"))
		if err != nil {
			return err
		}
		fmt.Println("  CPU by stage (s):", cpu)
	}
	r.Rate = float64(r.Rows) / r.Run.Seconds
	r.Ratio = r.Rate / r.CopyRate
	res.InitialLoad = r
	printInitial(r)
	return writeResult(out, res)
}

// printInitial prints the initial-load figures.
func printInitial(r InitialLoadResult) {
	fmt.Printf("  initial load of %d rows: COPY to nothing %.1f s (%.0f rows/s); lakeflow run %.1f s (%.0f rows/s, %.2f× COPY), peak RSS %d MiB, %.1f s CPU\n",
		r.Rows, r.CopySeconds, r.CopyRate, r.Run.Seconds, r.Rate, r.Ratio, r.Run.PeakRSS>>20, r.Run.CPUSecs)
}
