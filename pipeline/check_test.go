package pipeline

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// useDemoCatalog copies the catalog the project ships into the
// harness's catalog.dir.
func useDemoCatalog(t *testing.T, h *harness) {
	copyFiles(t, "../catalog/*.toml", h.cfg.Catalog.Dir, 20)
}

// check runs lakeflow check and returns its report.
func check(t *testing.T, h *harness, only string) *CheckReport {
	t.Helper()
	r, err := Check(context.Background(), h.cfg, only, h.log)
	if err != nil {
		t.Fatalf("lakeflow check: %v", err)
	}
	return r
}

// finding returns the report's error finding of a check, or fails.
func finding(t *testing.T, r *CheckReport, name, part string) Finding {
	t.Helper()
	for _, f := range r.Findings {
		if f.Check == name && f.Severity == "error" {
			if f.Part != part || r.Failed() != part {
				t.Errorf("%s failed part %s (the report fails %q), want %s", name, f.Part, r.Failed(), part)
			}
			return f
		}
	}
	t.Fatalf("no error %s in %+v", name, r.Findings)
	return Finding{}
}

// edit replaces old by new in a file until the test ends.
func edit(t *testing.T, path, old, new string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), old) {
		t.Fatalf("%s: %v, or no %q in it", path, err, old)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(path, data, 0o644) })
}

// TestCheckFindsEachKindOfProblem: lakeflow check passes on the demo
// shop with a clean workload, its contracts and its catalog; then each
// seeded problem fails it, in its own part: a contract with a bad rule,
// a catalog entry for a dataset that does not exist, a documented schema
// that drifted, orphan order lines, an order whose total is not its
// lines', an illegal status transition, a day with a tenth of the usual
// orders, and a column dropped at the source behind lakeflow's back.
func TestCheckFindsEachKindOfProblem(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, qualified(demoTables)...)
	useDemoContracts(t, h)
	useDemoCatalog(t, h)
	if err := demo.Setup(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		_, err := demo.Workload{Events: 1500, Seed: 61, Clean: true}.Run(ctx, dsn)
		return err
	}})
	r := check(t, h, "")
	if r.Failed() != "" || r.Passed[PartContracts] == 0 || r.Passed[PartCatalog] < 20 || r.Passed[PartData] < 5 {
		t.Fatalf("check of a clean demo: failed %q, passed %v, findings %+v", r.Failed(), r.Passed, r.Findings)
	}
	// The JSON report is stable: a machine reads these fields.
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Findings []map[string]any `json:"findings"`
		Passed   map[string]int   `json:"passed"`
		Seconds  float64          `json:"seconds"`
	}
	if err := json.Unmarshal(data, &parsed); err != nil || parsed.Passed[PartData] != r.Passed[PartData] {
		t.Fatalf("JSON report %s: %v", data, err)
	}

	t.Run("a contract with a bad rule", func(t *testing.T) {
		edit(t, filepath.Join(h.cfg.Contracts.Dir, "orders.toml"), `check = "total_cents >= 0"`, `check = "totl_cents >= 0"`)
		f := finding(t, check(t, h, ""), "contracts.valid", PartContracts)
		if !strings.Contains(f.Message, "orders.toml:") || !strings.Contains(f.Message, "totl_cents") {
			t.Errorf("the finding does not name the file, line and column: %s", f.Message)
		}
	})
	t.Run("a catalog entry for a missing dataset", func(t *testing.T) {
		ghost := filepath.Join(h.cfg.Catalog.Dir, "silver.ghost.toml")
		if err := os.WriteFile(ghost, []byte("name = \"silver.ghost\"\nkind = \"silver\"\nowner = \"x\"\ndescription = \"y\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(ghost)
		if f := finding(t, check(t, h, PartCatalog), "catalog.dataset_missing", PartCatalog); f.Dataset != "silver.ghost" {
			t.Errorf("finding %+v", f)
		}
	})
	t.Run("a drifted documented schema", func(t *testing.T) {
		edit(t, filepath.Join(h.cfg.Catalog.Dir, "silver.orders.toml"), "name = \"total_cents\"\ntype = \"BIGINT\"", "name = \"total_cents\"\ntype = \"INTEGER\"")
		if f := finding(t, check(t, h, PartCatalog), "catalog.schema_drift", PartCatalog); !strings.Contains(f.Message, "total_cents is BIGINT, documented as INTEGER") {
			t.Errorf("finding %+v", f)
		}
	})

	// Data problems the source lets through (it has no constraints for
	// them), ingested by a run.
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		return applySteps(ctx, dsn, [][]string{
			{`INSERT INTO order_items VALUES (987654, 1, 1, 2, 100)`},
			{`UPDATE orders SET total_cents = total_cents + 1 WHERE id = (SELECT min(order_id) FROM order_items)`},
			{`UPDATE orders SET status = 'pending' WHERE id = (SELECT min(id) FROM orders WHERE status = 'delivered')`},
			// 30 orders a day for two weeks, then 3 yesterday.
			{`INSERT INTO orders (id, customer_id, status, total_cents, currency, created_at)
				SELECT 800000 + 100 * d + k, 1, 'pending', 100, 'EUR', ((((now() AT TIME ZONE 'UTC')::date - d) + time '12:00') AT TIME ZONE 'UTC')
				FROM generate_series(1, 15) d, generate_series(1, 30) k WHERE d > 1 OR k <= 3`},
		})
	}})
	r = check(t, h, "")
	for name, want := range map[string]string{
		"order_items.order_exists":        "987654/1",
		"orders.total_matches_items":      " ≠ ",
		"orders.status_transitions_legal": "delivered → pending",
		"orders.daily_volume":             " orders, usually ",
	} {
		t.Run(name, func(t *testing.T) {
			f := finding(t, r, name, PartData)
			if f.Count != 1 || len(f.Examples) != 1 || !strings.Contains(f.Examples[0], want) {
				t.Errorf("finding %+v, want one example with %q", f, want)
			}
		})
	}

	t.Run("a column dropped behind lakeflow's back", func(t *testing.T) {
		if err := applySteps(ctx, h.dsn, [][]string{{`ALTER TABLE payments DROP COLUMN method`}}); err != nil {
			t.Fatal(err)
		}
		f := finding(t, check(t, h, PartContracts), "source.breaking_change", PartContracts)
		if f.Dataset != "public.payments" || !strings.Contains(f.Message, "method") || !strings.Contains(f.Fix, "payments.toml") {
			t.Errorf("finding %+v", f)
		}
		cat := check(t, h, PartCatalog)
		if slices.ContainsFunc(cat.Findings, func(f Finding) bool { return f.Severity == "error" }) || cat.Passed[PartContracts] > 0 {
			t.Errorf("--only catalog reports what is not the catalog's: %+v", cat)
		}
	})
	t.Run("a column dropped and added again", func(t *testing.T) {
		// Only the newest schema is there to compare: a warning, since a
		// change of the table between the two steps lets run follow them.
		if err := applySteps(ctx, h.dsn, [][]string{{`ALTER TABLE customers DROP COLUMN name`, `ALTER TABLE customers ADD COLUMN name text`}}); err != nil {
			t.Fatal(err)
		}
		findings := check(t, h, PartContracts).Findings
		i := slices.IndexFunc(findings, func(f Finding) bool { return f.Check == "source.moved_column" })
		if i < 0 {
			t.Fatalf("no finding source.moved_column in %+v", findings)
		}
		if f := findings[i]; f.Severity != "warning" || f.Dataset != "public.customers" || !strings.Contains(f.Message, "column name now follows") {
			t.Errorf("finding %+v", f)
		}
	})
}
