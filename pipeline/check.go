package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/catalog"
	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
	"github.com/lakeflow/lakeflow/warehouse"
)

// The parts of lakeflow check, in the order they run.
const (
	PartContracts = "contracts" // contract files, and the live source against them
	PartCatalog   = "catalog"   // the catalog against what exists
	PartData      = "data"      // population checks over silver, history, gold and the lake
)

// CheckParts are the parts, in order.
var CheckParts = []string{PartContracts, PartCatalog, PartData}

// Finding is one check that did not pass.
type Finding struct {
	Part     string   `json:"part"`
	Check    string   `json:"check"`
	Severity string   `json:"severity"` // error or warning
	Dataset  string   `json:"dataset,omitempty"`
	Count    int64    `json:"count"`
	Examples []string `json:"examples,omitempty"`
	Message  string   `json:"message"`
	Fix      string   `json:"fix,omitempty"`
}

// CheckReport is what lakeflow check found: the findings, failures
// first, and how many checks passed, per part.
type CheckReport struct {
	Findings []Finding      `json:"findings"`
	Passed   map[string]int `json:"passed"`
	Seconds  float64        `json:"seconds"`
}

// Failed is the first part (in CheckParts order) with an error, or "".
func (r *CheckReport) Failed() string {
	for _, p := range CheckParts {
		for _, f := range r.Findings {
			if f.Part == p && f.Severity == string(contracts.Error) {
				return p
			}
		}
	}
	return ""
}

// examples is how many violating rows a finding shows.
const examples = 5

// Check runs lakeflow check: the parts asked for (all if only is ""). It
// never writes, takes no lock a running pipeline holds, and reads the
// lake, not the live warehouse.
func Check(ctx context.Context, cfg *config.Config, only string, log *slog.Logger) (*CheckReport, error) {
	t0 := time.Now()
	r := &CheckReport{Passed: map[string]int{}}
	run := func(part string) bool { return only == "" || only == part }
	set, err := loadContracts(cfg, log)
	if err != nil {
		if !errors.Is(err, fault.ErrConfig) {
			return nil, err
		}
		r.add(Finding{Part: PartContracts, Check: "contracts.valid", Severity: "error", Message: err.Error(),
			Fix: "correct the contract files named (file:line)"})
		if run(PartContracts) {
			r.Seconds = time.Since(t0).Seconds()
			return r, nil // nothing else can be judged without them
		}
		set = contracts.Set{}
	} else if run(PartContracts) {
		r.Passed[PartContracts]++
	}
	var view *AsOf
	if run(PartData) || run(PartContracts) {
		// The warehouse as of the lake's end, built from the lake alone.
		if view, err = BuildAsOf(ctx, cfg, AsOfOptions{Position: lakeEnd}, log); err != nil {
			return nil, err
		}
		defer view.Close()
	}
	if run(PartContracts) {
		if err := r.checkSource(ctx, cfg, set, view, log); err != nil {
			return nil, err
		}
	}
	if run(PartCatalog) {
		if err := r.checkCatalog(ctx, cfg, log); err != nil {
			return nil, err
		}
	}
	if run(PartData) {
		if err := r.checkData(ctx, cfg, set, view); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		if a.Severity != b.Severity {
			return strings.Compare(a.Severity, b.Severity) // error before warning
		}
		return slices.Index(CheckParts, a.Part) - slices.Index(CheckParts, b.Part)
	})
	r.Seconds = time.Since(t0).Seconds()
	return r, nil
}

func (r *CheckReport) add(f Finding) { r.Findings = append(r.Findings, f) }

// checkParked reports the tables parked as of the published copy (none
// if there is none yet).
func (r *CheckReport) checkParked(ctx context.Context, cfg *config.Config) {
	rd, err := warehouse.OpenReader(ctx, cfg.Warehouse.Path)
	if err != nil {
		return
	}
	defer rd.Close()
	state := publishedState(ctx, rd)
	if state == nil {
		return
	}
	for _, p := range state.Parked {
		if p.Released != 0 {
			continue
		}
		r.add(Finding{Part: PartContracts, Check: "source.parked_table", Severity: "error", Dataset: p.Table, Count: 1,
			Message: fmt.Sprintf("the table is parked: its changes from %s on wait in the WAL while the other tables go on: %s", p.At, p.Reason), Fix: p.Fix})
	}
}

// checkSource judges the live source's schema of every captured table
// against what lakeflow knows (the lake's newest schema) under its
// contract, as run would: additive and widening changes are warnings
// (run evolves silver), breaking ones errors with the contract edit that
// accepts them. The embedded PostgreSQL is started if no pipeline runs,
// and read where it runs if one does.
func (r *CheckReport) checkSource(ctx context.Context, cfg *config.Config, set contracts.Set, view *AsOf, log *slog.Logger) error {
	dsn, release, err := reachSource(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer release()
	drafts, gone, err := postgres.Describe(ctx, dsn, cfg.Source.Tables)
	if err != nil {
		return err
	}
	slots, err := postgres.InactiveSlots(ctx, dsn, cfg.Source.Slot)
	if err != nil {
		return err
	}
	for _, s := range slots {
		r.add(Finding{Part: PartContracts, Check: "source.inactive_slot", Severity: "warning", Dataset: s.Name, Count: 1,
			Message: fmt.Sprintf("replication slot %s is read by no one and holds %d bytes of WAL on the source, which PostgreSQL cannot remove while it exists", s.Name, s.RetainedBytes),
			Fix:     "unless another tool uses it: " + s.Drop()})
	}
	r.checkParked(ctx, cfg)
	known := view.Schemas()
	for _, t := range gone {
		f := Finding{Part: PartContracts, Check: "source.table_gone", Severity: "warning", Dataset: t.String(), Count: 1,
			Message: "the table no longer exists in the source: lakeflow run applies its changes still in the WAL; silver, history and lake keep it",
			Fix:     "take it out of source.tables"}
		if known[t.String()] == nil {
			f.Check, f.Severity = "source.missing_table", "error"
			f.Message = "the table is in source.tables but not in the source, and lakeflow never captured it: lakeflow run refuses to start"
			f.Fix = "correct the name in source.tables (schema.table as \\dt shows it), or create the table"
		}
		r.add(f)
	}
	for _, d := range drafts {
		live, err := d.Schema()
		if err != nil {
			return err
		}
		id := live.ID()
		prev := known[id]
		if prev == nil {
			r.Passed[PartContracts]++ // not captured yet: run takes it as it is
			continue
		}
		diff, _, err := contracts.Judge(set[id], prev, live)
		var refusal *contracts.Refusal
		switch {
		case errors.As(err, &refusal):
			for i, bc := range refusal.Changes {
				if bc.What == "moved" {
					// Only the newest schema is here: the table may have
					// changed more than once since the one lakeflow knows,
					// and run sees every version a change of the table
					// carries.
					r.add(Finding{Part: PartContracts, Check: "source.moved_column", Severity: "warning", Dataset: id, Count: 1,
						Message: bc.Error() + ": lakeflow run stops here unless changes to the table came between the schema changes", Fix: refusal.Hints[i]})
					continue
				}
				r.add(Finding{Part: PartContracts, Check: "source.breaking_change", Severity: "error", Dataset: id, Count: 1,
					Message: bc.Error() + ": lakeflow run will stop here", Fix: refusal.Hints[i]})
			}
			continue
		case err != nil:
			return err
		}
		for _, c := range diff.Added {
			r.add(Finding{Part: PartContracts, Check: "source.additive_change", Severity: "warning", Dataset: id, Count: 1,
				Message: fmt.Sprintf("column %s %s was added at the source: lakeflow run adds it to silver", c.Name, c.Type.Name)})
		}
		for _, w := range diff.Widened {
			r.add(Finding{Part: PartContracts, Check: "source.widening_change", Severity: "warning", Dataset: id, Count: 1,
				Message: fmt.Sprintf("column %s was widened from %s to %s: lakeflow run widens it in silver", w.Column.Name, w.From.Name, w.Column.Type.Name)})
		}
		r.Passed[PartContracts]++
	}
	return nil
}

// checkCatalog compares the catalog with what exists.
func (r *CheckReport) checkCatalog(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	documented, err := catalog.Load(cfg.Catalog.Dir)
	if err != nil {
		if !errors.Is(err, fault.ErrConfig) {
			return err
		}
		r.add(Finding{Part: PartCatalog, Check: "catalog.valid", Severity: "error", Message: err.Error(), Fix: "correct the catalog files named (file:line)"})
		return nil
	}
	derived, err := DeriveCatalog(ctx, cfg, log)
	if err != nil {
		return err
	}
	bad := map[string]bool{}
	for _, p := range catalog.Compare(documented, derived) {
		severity := "error"
		if p.Warning {
			severity = "warning" // the entry still describes the dataset
		} else {
			bad[p.Dataset] = true
		}
		r.add(Finding{Part: PartCatalog, Check: p.Check, Severity: severity, Dataset: p.Dataset, Count: 1, Message: p.Message, Fix: p.Fix})
	}
	for _, d := range derived {
		if !bad[d.Name] {
			r.Passed[PartCatalog]++ // a dataset its entry describes
		}
	}
	return nil
}

// checkData runs the population checks over the warehouse as of the
// lake's end: each table's column drift, every existence rule over the
// whole table, every check the contracts declare, and each table's
// freshness against its SLA.
func (r *CheckReport) checkData(ctx context.Context, cfg *config.Config, set contracts.Set, view *AsOf) error {
	if err := view.LakeViews(ctx, view.Bound); err != nil {
		return err
	}
	schemas := view.Schemas()
	var all []string
	for id := range schemas {
		all = append(all, id)
	}
	slices.Sort(all)
	for _, id := range all {
		if err := r.drift(ctx, view, schemas[id]); err != nil {
			return err
		}
	}
	var ids []string
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c := set[id]
		t := schemas[id]
		if t == nil {
			continue // not in the lake yet
		}
		for _, rule := range c.Rules {
			if rule.References == nil || schemas[rule.References.Table.String()] == nil {
				continue
			}
			u := rule.References.Table.String()
			if err := r.population(ctx, view, PartData, rule.Name, "error", id, existenceSQL(t, schemas[u], rule, c.Pending(t), set[u].Pending(schemas[u])),
				"rows whose referenced row does not exist (or is deleted) now", "find why the referenced rows are gone: lakeflow asof shows when"); err != nil {
				return err
			}
		}
		for _, ch := range c.Checks {
			if err := r.population(ctx, view, PartData, ch.Name, string(ch.Severity), id, ch.SQL, ch.Description, ""); err != nil {
				return err
			}
		}
		if c.Freshness > 0 {
			r.freshness(ctx, view, c, t)
		}
	}
	return nil
}

// population runs one population check and records its result.
func (r *CheckReport) population(ctx context.Context, view *AsOf, part, name, severity, dataset, query, what, fix string) error {
	n, rows, err := view.Violations(ctx, query, examples)
	if err != nil {
		r.add(Finding{Part: part, Check: name, Severity: "error", Dataset: dataset, Message: "the check does not run: " + fault.OneLine(err.Error()),
			Fix: "correct its SQL in the contract"})
		return nil
	}
	if n == 0 {
		r.Passed[part]++
		return nil
	}
	f := Finding{Part: part, Check: name, Severity: severity, Dataset: dataset, Count: n, Message: what, Fix: fix}
	for _, row := range rows {
		f.Examples = append(f.Examples, example(row))
	}
	if f.Message == "" {
		f.Message = "rows that break it"
	}
	r.add(f)
	return nil
}

// example shows a violating row: its key (and detail), or the row.
func example(row string) string {
	var m map[string]any
	if json.Unmarshal([]byte(row), &m) != nil || m["key"] == nil {
		return row
	}
	s := fmt.Sprint(m["key"])
	if d, ok := m["detail"]; ok && d != nil {
		s += " (" + fmt.Sprint(d) + ")"
	}
	return s
}

// existenceSQL is an existence rule over the whole of t: its live rows
// whose referenced row in u is missing or deleted. tr and ur are the
// renames t's and u's contracts accept that silver has not taken yet.
func existenceSQL(t, u *change.Table, rule contracts.Rule, tr, ur contracts.Renames) string {
	var keys, on, notNull, detail []string
	for _, i := range t.KeyColumns() {
		keys = append(keys, "t."+quoteIdent(t.Columns[i].Name)+"::VARCHAR")
	}
	for _, p := range rule.References.Columns {
		col := quoteIdent(tr.Column(p[0]))
		on = append(on, fmt.Sprintf("u.%s = t.%s", quoteIdent(ur.Column(p[1])), col))
		notNull = append(notNull, "t."+col+" IS NOT NULL")
		detail = append(detail, fmt.Sprintf("'%s = ' || t.%s", strings.ReplaceAll(p[0], "'", "''"), col))
	}
	return fmt.Sprintf(`SELECT concat_ws('/', %s) AS key, concat_ws(', ', %s) AS detail FROM silver.%s t
		WHERE NOT t._deleted AND %s AND NOT EXISTS (SELECT 1 FROM silver.%s u WHERE NOT u._deleted AND %s)`,
		strings.Join(keys, ", "), strings.Join(detail, ", "), quoteIdent(t.Name), strings.Join(notNull, " AND "), quoteIdent(u.Name), strings.Join(on, " AND "))
}

// freshness warns when a table's newest change in the lake is older
// than its SLA (the source may be idle: a warning, not an error).
func (r *CheckReport) freshness(ctx context.Context, view *AsOf, c *contracts.Contract, t *change.Table) {
	var newest *time.Time
	name := "silver." + t.Name
	if view.QueryRow(ctx, fmt.Sprintf("SELECT max(_commit_ts) FROM silver.%s", quoteIdent(t.Name)), &newest) != nil || newest == nil {
		return
	}
	if age := time.Since(*newest); age > c.Freshness {
		r.add(Finding{Part: PartData, Check: t.Name + ".freshness", Severity: "warning", Dataset: name, Count: 1,
			Message: fmt.Sprintf("the newest change is %s old, past its freshness SLA of %s (or the source is idle)", age.Round(time.Second), c.Freshness),
			Fix:     "lakeflow run --follow keeps it fresh"})
		return
	}
	r.Passed[PartData]++
}

// checkRun is one scheduled run of the data checks.
type checkRun struct {
	at     time.Time
	report *CheckReport
}

// scheduleChecks runs the data part of lakeflow check every interval,
// beside the pipeline (it reads the lake, not the warehouse), until ctx
// ends, and hands each report over; a run that fails is logged.
func scheduleChecks(ctx context.Context, cfg *config.Config, log *slog.Logger) <-chan checkRun {
	out := make(chan checkRun, 1)
	go func() {
		t := time.NewTicker(cfg.Check.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case at := <-t.C:
				r, err := Check(ctx, cfg, PartData, log)
				if err != nil {
					if ctx.Err() == nil {
						log.Warn("scheduled check failed", "err", err)
					}
					continue
				}
				select {
				case out <- checkRun{at: at, report: r}:
				default: // the last one is not recorded yet: skip this one
				}
			}
		}
	}()
	return out
}

// recordChecks records the scheduled checks' results that arrived.
func (c *consumer) recordChecks(ctx context.Context) error {
	select {
	case run := <-c.checks:
		var rows []warehouse.CheckResult
		for _, f := range run.report.Findings {
			rows = append(rows, warehouse.CheckResult{Part: f.Part, Check: f.Check, Severity: f.Severity, Dataset: f.Dataset,
				Count: f.Count, Examples: f.Examples, Message: f.Message})
		}
		for part, n := range run.report.Passed {
			rows = append(rows, warehouse.CheckResult{Part: part, Check: "passed", Severity: "ok", Count: int64(n)})
		}
		if failed := run.report.Failed(); failed != "" {
			c.log.Warn("scheduled check failed", "part", failed, "findings", len(run.report.Findings))
		}
		return c.wh.RecordChecks(statement(ctx), run.at, rows)
	default:
		return nil
	}
}
