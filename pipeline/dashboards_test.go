package pipeline

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The dashboard and alerts shipped for the metrics.
const (
	dashboardFile = "../docs/grafana/lakeflow.json"
	alertsFile    = "../docs/prometheus/alerts.yml"
)

// TestAlertRulesAndDashboardAreValid: promtool accepts the alerting
// rules, and the dashboard is a Grafana dashboard whose every panel
// queries something.
func TestAlertRulesAndDashboardAreValid(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install it (apt-get install prometheus), or run the tests with scripts/test")
	}
	if out, err := exec.Command(promtool, "check", "rules", alertsFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertsFile, err, out)
	}
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil || dash.Title == "" || len(dash.Panels) == 0 {
		t.Fatalf("%s is no dashboard: %v", dashboardFile, err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, q := range p.Targets {
			if q.Expr == "" {
				t.Errorf("panel %q has a target without a query", p.Title)
			}
		}
	}
}

// metricName matches a metric's name in a query: lakeflow's, the Go and
// process collectors'.
var metricName = regexp.MustCompile(`\b(?:lakeflow|go|process)_[a-z0-9_]+\b`)

// assertDashboardMetricsExist checks that every metric the dashboard and
// the alerts name is one lakeflow serves at url (a histogram's by its
// _bucket, _sum or _count too).
func assertDashboardMetricsExist(t *testing.T, url string) {
	t.Helper()
	families := scrape(t, url)
	served := func(name string) bool {
		if families[name] != nil {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if f := families[strings.TrimSuffix(name, suffix)]; strings.HasSuffix(name, suffix) && f != nil && f.GetType().String() == "HISTOGRAM" {
				return true
			}
		}
		return false
	}
	for _, file := range []string{dashboardFile, alertsFile} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		names := metricName.FindAllString(string(data), -1)
		if len(names) == 0 {
			t.Fatalf("%s names no metric", file)
		}
		for _, name := range slices.Compact(slices.Sorted(slices.Values(names))) {
			if !served(name) {
				t.Errorf("%s names %s, which lakeflow does not serve", file, name)
			}
		}
	}
}
