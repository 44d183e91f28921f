package pipeline

import (
	"context"
	"encoding/csv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// TestReportRendersInChromium: lakeflow report on the demo's warehouse
// renders in a headless Chromium without a console error; every chart
// drew (an SVG with marks), the lineage too; and every figure the page
// shows with its query is what lakeflow sql answers to that query. With
// REPORT_SCREENSHOT=FILE, the screenshot is kept there (the
// README's).
func TestReportRendersInChromium(t *testing.T) {
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: install it (apt-get install chromium), or run the tests with scripts/test")
	}
	h := newDemoHarness(t)
	useDemoContracts(t, h)
	copyFiles(t, "../catalog/*.toml", h.cfg.Catalog.Dir, 20)
	h.run(t, demoWorkload(demo.Workload{Events: 3000, Seed: 61}))
	out := filepath.Join(t.TempDir(), "report.html")
	if got, err := withStderr(lakeflowCmd(t, "--config", h.file, "check").Output()); err != nil && !strings.Contains(err.Error(), "exit status 7") {
		t.Fatalf("lakeflow check: %v\n%s", err, got) // (the demo breaks data rules on purpose: exit 7)
	}
	if got, err := withStderr(lakeflowCmd(t, "--config", h.file, "report", "--out", out).Output()); err != nil {
		t.Fatalf("lakeflow report: %v\n%s", err, got)
	}

	var mu sync.Mutex
	var problems []string
	listen := func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeWarning {
				problems = append(problems, "console "+e.Type.String())
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+e.ExceptionDetails.Text)
		case *network.EventRequestWillBeSent:
			if !strings.HasPrefix(e.Request.URL, "file://") {
				problems = append(problems, "fetched "+e.Request.URL)
			}
		}
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.WindowSize(1200, 900))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(listen))
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+out), chromedp.WaitReady("body")); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	marks, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`Array.from(document.querySelectorAll('figure.chart')).map(f => f.querySelectorAll('svg path, svg rect, svg circle').length)`))
	if err != nil {
		t.Fatal(err)
	}
	lineage, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('figure.graph svg rect').length`))
	if err != nil {
		t.Fatal(err)
	}
	figures, err := chromedp.Run(ctx, chromedp.Evaluate[[][2]string](`Array.from(document.querySelectorAll('[data-sql]')).map(e => [e.dataset.sql, e.textContent])`))
	if err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(80))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the page logged: %v", problems)
	}
	if len(marks) < 4 {
		t.Errorf("%d charts drew, want throughput, freshness, lake bytes and quarantine at least", len(marks))
	}
	for i, n := range marks {
		if n < 5 {
			t.Errorf("chart %d has %d marks", i+1, n)
		}
	}
	if lineage < 20 {
		t.Errorf("the lineage graph has %d nodes", lineage)
	}
	if len(shot) == 0 {
		t.Error("no screenshot")
	} else if keep := os.Getenv("REPORT_SCREENSHOT"); keep != "" {
		if err := os.WriteFile(keep, shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The figures, as lakeflow sql gives them.
	if len(figures) < 10 {
		t.Fatalf("%d figures carry their query", len(figures))
	}
	for _, f := range figures {
		got, err := withStderr(lakeflowCmd(t, "--config", h.file, "sql", "--format", "csv", f[0]).Output())
		if err != nil {
			t.Fatalf("lakeflow sql %q: %v", f[0], err)
		}
		records, err := csv.NewReader(strings.NewReader(string(got))).ReadAll()
		if err != nil || len(records) != 2 || len(records[1]) != 1 {
			t.Fatalf("lakeflow sql %q: %v\n%s", f[0], err, got)
		}
		if records[1][0] != f[1] {
			t.Errorf("the page shows %q for %s; lakeflow sql says %q", f[1], f[0], records[1][0])
		}
	}
}
