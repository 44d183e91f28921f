package report

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/catalog"
)

// summary: where the published warehouse stands.
func (b *builder) summary(p *Page) error {
	for _, f := range [][2]string{
		{"published batch", "SELECT batch FROM lakeflow.published"},
		{"source position (_cdc_seq)", "SELECT _cdc_seq FROM lakeflow.published"},
		{"data as of (source commit)", "SELECT commit_ts FROM lakeflow.published"},
		{"published at", "SELECT published_at FROM lakeflow.published"},
		{"lake files", "SELECT count(*) FROM lakeflow.lake_files"},
		{"quarantined changes", "SELECT count(*) FROM lakeflow.quarantine"},
		{"dead letters", "SELECT count(*) FROM lakeflow.dlq"},
	} {
		fig, err := b.figure(f[0], f[1])
		if err != nil {
			return err
		}
		p.Summary = append(p.Summary, fig)
	}
	return nil
}

// throughput: events per second and freshness (source commit to silver)
// over time, from the batches (and, for throughput, the hours older
// batches were summed into), in about sixty steps.
func (b *builder) throughput(p *Page) error {
	_, span, err := b.rows("SELECT epoch(min(committed_at)), epoch(max(committed_at)) FROM lakeflow.batches WHERE committed_at >= " + b.since)
	if err != nil {
		return err
	}
	step := 1.0
	if lo, err1 := strconv.ParseFloat(span[0][0], 64); err1 == nil {
		hi, _ := strconv.ParseFloat(span[0][1], 64)
		step = max(1, math.Ceil((hi-lo)/60))
	}
	bucket := fmt.Sprintf("to_seconds(%d)", int64(step))
	events, err := b.series(fmt.Sprintf(`SELECT epoch(t), events / %[2]f FROM (
			SELECT time_bucket(%[1]s, committed_at) AS t, sum(events) AS events FROM lakeflow.batches WHERE committed_at >= %[3]s GROUP BY 1
			UNION ALL
			SELECT hour, events * %[2]f / 3600 FROM lakeflow.batch_hours
			WHERE hour >= %[3]s AND hour < (SELECT coalesce(min(committed_at), now()) FROM lakeflow.batches))
		ORDER BY 1`, bucket, step, b.since), "events/s applied")
	if err != nil {
		return err
	}
	p.Throughput = lineChart(Chart{Title: "Throughput", Caption: fmt.Sprintf("events applied per second, in steps of %s (hours before the batches kept: lakeflow.batch_hours)", time.Duration(step)*time.Second),
		Empty: "no batch in the period"}, "Events applied per second", "events/s", events)
	fresh, err := b.series(fmt.Sprintf(`SELECT epoch(time_bucket(%s, committed_at)) AS t,
			quantile_cont(epoch(committed_at) - epoch(commit_ts), 0.5), quantile_cont(epoch(committed_at) - epoch(commit_ts), 0.99)
		FROM lakeflow.batches WHERE committed_at >= %s AND consistent AND commit_ts IS NOT NULL GROUP BY 1 ORDER BY 1`, bucket, b.since), "p50", "p99")
	if err != nil {
		return err
	}
	p.Fresh = lineChart(Chart{Title: "Freshness", Caption: "source commit of each batch's newest transaction to its commit in silver", Empty: "no consistent batch in the period"},
		"Freshness: source commit to silver", "seconds", fresh)
	return nil
}

// lineChart draws c as lines of series over time (heading the plot's
// title, unit its y axis's) if any has a point; else c says why not
// (c.Empty).
func lineChart(c Chart, heading, unit string, series []Series) Chart {
	if !slices.ContainsFunc(series, func(s Series) bool { return len(s.Points) > 0 }) {
		return c
	}
	svg, err := lines(heading, unit, series...)
	if err != nil {
		c.Empty = "not drawn: " + err.Error()
		return c
	}
	c.SVG, c.Empty = svg, ""
	return c
}

// datasets: each silver table's rows, and the published data's age
// against the freshness its contract asks for.
func (b *builder) datasets(p *Page) error {
	_, asOf, err := b.rows("SELECT epoch(commit_ts) FROM lakeflow.published")
	if err != nil {
		return err
	}
	age := time.Duration(-1)
	if len(asOf) > 0 && asOf[0][0] != "" {
		at, _ := strconv.ParseFloat(asOf[0][0], 64)
		age = b.in.Now.Sub(time.Unix(0, int64(at*1e9))).Round(time.Second)
	}
	for _, d := range b.in.Catalog {
		if d.Kind != catalog.Silver {
			continue
		}
		rows, err := b.figure("rows", fmt.Sprintf("SELECT count(*) FROM %s WHERE NOT _deleted", d.Name))
		if err != nil {
			return err
		}
		ds := Dataset{Name: d.Name, Rows: rows, SLA: "none", Age: "unknown"}
		if age >= 0 {
			ds.Age = age.String()
		}
		if c := b.in.Contracts[strings.TrimPrefix(d.Source, catalog.SourcePrefix)]; c != nil && c.Freshness > 0 {
			ds.SLA = c.Freshness.String()
			ds.Late = age < 0 || age > c.Freshness
		}
		p.Datasets = append(p.Datasets, ds)
	}
	return nil
}

// lake: files and bytes per table and commit day, with the files a
// compaction merged them from.
func (b *builder) lake(p *Page) error {
	t, err := b.table("Lake files per table and day", `SELECT f.source_table AS "table", f.day::VARCHAR AS day, count(*) AS files, sum(f.bytes) AS bytes,
			any_value(c.merged) AS "merged from"
		FROM lakeflow.lake_files f LEFT JOIN (SELECT source_table, day, sum(replaced) AS merged FROM lakeflow.compactions WHERE swapped_at IS NOT NULL GROUP BY ALL) c
			ON c.source_table = f.source_table AND c.day = f.day
		GROUP BY ALL ORDER BY 2 DESC, 1`)
	if err != nil {
		return err
	}
	p.LakeDays = t
	tables, days := []string{}, []string{}
	for _, r := range t.Rows {
		tables, days = append(tables, r[0]), append(days, r[1])
	}
	slices.Sort(tables)
	tables, days = slices.Compact(tables), slices.Compact(slices.Sorted(slices.Values(days)))
	data := make([]Bar, len(days))
	for i, d := range days {
		data[i] = Bar{Label: d, Parts: make([]float64, len(tables))}
		for _, r := range t.Rows {
			if r[1] == d {
				v, _ := strconv.ParseFloat(r[3], 64)
				data[i].Parts[slices.Index(tables, r[0])] = v / (1 << 20)
			}
		}
	}
	p.Lake = Chart{Title: "Lake bytes per day", Caption: "MiB of Parquet per commit day, by table", Empty: "the lake holds no file"}
	if len(data) > 0 {
		svg, err := bars("Lake MiB per commit day", "MiB", tables, data)
		if err != nil {
			return err
		}
		p.Lake.SVG, p.Lake.Empty = svg, ""
	}
	return nil
}

// quarantine: changes held back, by rule and commit day, with a few keys
// of each.
func (b *builder) quarantine(p *Page) error {
	_, rows, err := b.rows(`SELECT day::VARCHAR, rule, count(*) FROM (SELECT CAST(_commit_ts AS DATE) AS day, unnest(rules) AS rule FROM lakeflow.quarantine WHERE _commit_ts >= ` + b.since + `)
		GROUP BY ALL ORDER BY ALL`)
	if err != nil {
		return err
	}
	var rules, days []string
	for _, r := range rows {
		rules, days = append(rules, r[1]), append(days, r[0])
	}
	rules, days = slices.Compact(slices.Sorted(slices.Values(rules))), slices.Compact(days)
	data := make([]Bar, len(days))
	for i, d := range days {
		data[i] = Bar{Label: d, Parts: make([]float64, len(rules))}
		for _, r := range rows {
			if r[0] == d {
				n, _ := strconv.ParseFloat(r[2], 64)
				data[i].Parts[slices.Index(rules, r[1])] = n
			}
		}
	}
	p.Quarantine = Chart{Title: "Quarantine by rule", Caption: "changes a contract rule held back, per source commit day", Empty: "no change was held back in the period"}
	if len(data) > 0 {
		svg, err := bars("Changes held back per day, by rule", "changes", rules, data)
		if err != nil {
			return err
		}
		p.Quarantine.SVG, p.Quarantine.Empty = svg, ""
	}
	p.QuarantineExamples, err = b.table("Examples (newest keys of each rule)", `SELECT rule, source_table AS "table", count(*) AS changes,
			array_to_string(list(key::VARCHAR ORDER BY _cdc_seq DESC)[1:3], '  ') AS "example keys"
		FROM (SELECT unnest(rules) AS rule, source_table, key, _cdc_seq FROM lakeflow.quarantine) GROUP BY ALL ORDER BY 3 DESC, 1`)
	return err
}

// deadLetters: records set aside, over time.
func (b *builder) deadLetters(p *Page) error {
	dead, err := b.series(`SELECT epoch(date_trunc('hour', dead_at)), count(*) FROM lakeflow.dlq WHERE dead_at >= `+b.since+` GROUP BY 1 ORDER BY 1`, "dead letters per hour")
	if err != nil {
		return err
	}
	p.Dead = lineChart(Chart{Title: "Dead letters", Caption: "records lakeflow could not apply, set aside in lakeflow.dlq", Empty: "no dead letter in the period"},
		"Dead letters per hour", "records", dead)
	return nil
}

// checks: the last lakeflow check's findings.
func (b *builder) checks(p *Page) error {
	_, at, err := b.rows("SELECT max(checked_at)::VARCHAR FROM lakeflow.checks")
	if err != nil {
		return err
	}
	if len(at) == 0 || at[0][0] == "" {
		return nil
	}
	p.CheckedAt = at[0][0]
	p.Checks, err = b.table("", `SELECT part, "check", severity, dataset, count, message FROM lakeflow.checks
		WHERE checked_at = (SELECT max(checked_at) FROM lakeflow.checks) ORDER BY severity, part, "check", dataset`)
	return err
}

// schemas: each table's schema changes as a timeline.
func (b *builder) schemas(p *Page) error {
	var err error
	p.SchemaChanges, err = b.table("Schema history", `SELECT source_table AS "table", recorded_at::VARCHAR AS recorded, change FROM lakeflow.schema_history ORDER BY recorded_at, source_table`)
	if err != nil {
		return err
	}
	_, rows, err := b.rows(`SELECT source_table, epoch(recorded_at) FROM lakeflow.schema_history ORDER BY 1, 2`)
	if err != nil {
		return err
	}
	var series []Series
	for _, r := range rows {
		if len(series) == 0 || series[len(series)-1].Name != r[0] {
			series = append(series, Series{Name: r[0]})
		}
		at, _ := strconv.ParseFloat(r[1], 64)
		s := &series[len(series)-1]
		s.Points = append(s.Points, Point{At: time.Unix(0, int64(at*1e9)), Value: float64(len(series))})
	}
	p.Schemas = lineChart(Chart{Title: "Schema history", Caption: "each table's schema versions as lakeflow recorded them (one row per table)", Empty: "no schema recorded"},
		"Schema versions over time", "table", series)
	return nil
}

// marts: each gold mart's latest rows.
func (b *builder) marts(p *Page) error {
	for _, d := range b.in.Catalog {
		if d.Kind != catalog.Gold {
			continue
		}
		t, err := b.table(d.Name, fmt.Sprintf("SELECT * FROM %s ORDER BY 1 DESC LIMIT 8", d.Name))
		if err != nil {
			return err
		}
		p.Marts = append(p.Marts, t)
	}
	return nil
}
