package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
	"github.com/lakeflow/lakeflow/warehouse"
)

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, exitOK},
		{fmt.Errorf("%w: bad key", fault.ErrConfig), exitConfig},
		{fmt.Errorf("%w: no such column", fault.ErrQuery), exitQuery},
		{fmt.Errorf("start: %w", fmt.Errorf("%w: no initdb", fault.ErrEnvironment)), exitEnvironment},
		{fmt.Errorf("%w: kafka down", fault.ErrUnavailable), exitEnvironment},
		{fmt.Errorf("%w: no replication", fault.ErrSource), exitEnvironment},
		{errors.Join(context.Canceled, fmt.Errorf("%w: column dropped", fault.ErrSchemaBreak)), exitCheck},
		{errors.New("bug"), exitInternal},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if got := fault.OneLine("Conversion Error: x\n\nLINE 1: SELECT\n   ^"); got != "Conversion Error: x LINE 1: SELECT ^" {
		t.Errorf("oneLine: %q", got)
	}
}

// TestEveryCommandTakesTheCommonFlags: each command, and each parent of
// subcommands, takes --config before its subcommand and calls an unknown
// flag a usage error (exit 2, naming the command's help), not a failure.
func TestEveryCommandTakesTheCommonFlags(t *testing.T) {
	var walk func(path []string, cmds []*cli.Command)
	walk = func(path []string, cmds []*cli.Command) {
		for _, cmd := range cmds {
			p := append(slices.Clone(path), cmd.Name)
			err := newApp().Run(append(slices.Concat([]string{"lakeflow"}, p), "--no-such-flag"))
			if exitCode(err) != exitConfig || !strings.Contains(fmt.Sprint(err), "see lakeflow "+strings.Join(p, " ")+" --help") {
				t.Errorf("lakeflow %s --no-such-flag: exit %d, %v", strings.Join(p, " "), exitCode(err), err)
			}
			if len(cmd.Subcommands) > 0 {
				sub := cmd.Subcommands[0].Name
				err := newApp().Run(slices.Concat([]string{"lakeflow"}, p, []string{"--config", "/nonexistent/lakeflow.toml", sub}))
				if !strings.Contains(fmt.Sprint(err), "/nonexistent/lakeflow.toml") {
					t.Errorf("lakeflow %s --config F %s did not read F: %v", strings.Join(p, " "), sub, err)
				}
				walk(p, cmd.Subcommands)
			}
		}
	}
	walk(nil, newApp().Commands)
}

// TestDemoEventsNeedsTheDemo: a flag that would do nothing is refused.
func TestDemoEventsNeedsTheDemo(t *testing.T) {
	if err := newApp().Run([]string{"lakeflow", "run", "--demo-events", "100"}); exitCode(err) != exitConfig || !strings.Contains(fmt.Sprint(err), "add --demo") {
		t.Errorf("run --demo-events without --demo: exit %d, %v", exitCode(err), err)
	}
}

func TestPrintResult(t *testing.T) {
	s := func(v string) *string { return &v }
	r := warehouse.Result{Columns: []string{"id", "note"}, Rows: [][]*string{{s("1"), nil}, {s("22"), s("a|b, \"c\"")}},
		JSON: []string{`{"id":1,"note":null}`}}
	for format, want := range map[string]string{
		"text":     "id   note\n---  --------\n1    NULL\n22   a|b, \"c\"\n(2 rows)\n",
		"csv":      "id,note\n1,\n22,\"a|b, \"\"c\"\"\"\n",
		"markdown": "| id  | note      |\n| --- | --------- |\n| 1   | NULL      |\n| 22  | a\\|b, \"c\" |\n",
		"json":     `{"id":1,"note":null}` + "\n",
	} {
		var b strings.Builder
		if err := printResult(&b, r, format); err != nil {
			t.Fatal(err)
		}
		if b.String() != want {
			t.Errorf("%s:\n%s\nwant:\n%s", format, b.String(), want)
		}
	}
	if err := checkFormat("yaml"); err == nil || !errors.Is(err, fault.ErrConfig) {
		t.Errorf("--format yaml: %v", err)
	}
}

func TestFlagsAfterTheArgument(t *testing.T) {
	for _, tc := range [][2][]string{
		{{"lakeflow", "--config", "x.toml", "asof", "0/16B3748", "--table", "orders", "--list", "--limit=3"},
			{"lakeflow", "--config", "x.toml", "asof", "--table", "orders", "--list", "--limit=3", "0/16B3748"}},
		{{"lakeflow", "asof", "--format", "csv", "batch:3", "--where", "id > 3"},
			{"lakeflow", "asof", "--format", "csv", "--where", "id > 3", "batch:3"}},
		{{"lakeflow", "contracts", "init", "--table", "public.orders"}, {"lakeflow", "contracts", "init", "--table", "public.orders"}},
		{{"lakeflow", "--log-level", "debug", "run", "--follow"}, {"lakeflow", "--log-level", "debug", "run", "--follow"}},
		{{"lakeflow", "--config", "f", "psql", "--", "-c", "SELECT 1", "-X"}, {"lakeflow", "--config", "f", "psql", "--", "-c", "SELECT 1", "-X"}},
	} {
		if got := flagsFirst(newApp(), tc[0]); !slices.Equal(got, tc[1]) {
			t.Errorf("flagsFirst(%q) = %q, want %q", tc[0], got, tc[1])
		}
	}
}

// TestQueryErrorsInTheUsersTerms: a query's errors are the query's class
// (exit 8), not the configuration's; a statement that does not read is
// named so, a misspelled first word gets the word meant, and DuckDB's
// excerpt of the wrapped statement is left out.
func TestQueryErrorsInTheUsersTerms(t *testing.T) {
	for q, want := range map[string]string{
		"create table x(a int)":              "only queries that read run here (SELECT, WITH, FROM, VALUES …), not CREATE",
		"  -- note\n (DELETE FROM silver.t)": "not DELETE",
		"SELEC * FROM silver.t":              "query: SELEC is no SQL keyword a query starts with (did you mean SELECT?)",
		"SELECT nope FROM silver.t":          `query: Binder Error: column "nope" not found Candidate bindings: "id"`,
	} {
		err := queryError(q, errors.New("Binder Error: column \"nope\" not found\nCandidate bindings: \"id\"\n\nLINE 1: SELECT COLUMNS(*)::VARCHAR FROM (SELECT nope"))
		if got := fault.OneLine(err.Error()); exitCode(err) != exitQuery || !strings.Contains(got, want) || strings.Contains(got, "COLUMNS(*)") {
			t.Errorf("queryError(%q) = %q (exit %d), want a query error saying %q", q, got, exitCode(err), want)
		}
	}
}

// TestStatusListsTheRulesThatHeldMostFirst: the quarantine line names the
// rules by how much they held back, and nothing when nothing is held.
func TestStatusListsTheRulesThatHeldMostFirst(t *testing.T) {
	for want, held := range map[string]pipeline.HeldStatus{
		"quarantined   9 (public.b.y 5, public.a.x 2, public.c.z 2); dead letters 1\n": {Quarantined: 9, Dead: 1,
			TopRules: map[string]int64{"public.a.x": 2, "public.b.y": 5, "public.c.z": 2}},
		"quarantined   0; dead letters 0\n": {},
	} {
		var out strings.Builder
		printStatus(&out, &pipeline.StatusReport{Held: held})
		if !strings.Contains(out.String(), want) {
			t.Errorf("status printed\n%s\nwant the line %q", out.String(), want)
		}
	}
}

// TestAgesReadAlike: the ages status prints carry one precision for
// their size (22.031s beside 22.59s read oddly).
func TestAgesReadAlike(t *testing.T) {
	for s, want := range map[float64]string{0.25: "250ms", 22.031: "22s", 22.59: "22.6s", 95.4: "1m35s", 7200.2: "2h0m0s"} {
		if got := ago(s); got != want {
			t.Errorf("ago(%v) = %q, want %q", s, got, want)
		}
	}
}

// TestStatusSaysHowTheSlotIsRead: connected or not, and the lag only when
// PostgreSQL measures one.
func TestStatusSaysHowTheSlotIsRead(t *testing.T) {
	lag := 2.5
	for want, slot := range map[string]pipeline.SlotStatus{
		"slot          s: 10 bytes behind the source's WAL; no reader connected\n":  {Name: "s", LagBytes: 10},
		"slot          s: 0 bytes behind the source's WAL; being read, idle\n":      {Name: "s", Active: true},
		"slot          s: 5 bytes behind the source's WAL; being read, 2.5s behind": {Name: "s", Active: true, LagBytes: 5, LagSeconds: &lag},
	} {
		var out strings.Builder
		printStatus(&out, &pipeline.StatusReport{Slot: &slot})
		if !strings.Contains(out.String(), want) {
			t.Errorf("status printed\n%s\nwant %q", out.String(), want)
		}
	}
}

// TestBadMetricsAddrStopsBeforeAnythingStarts: a --metrics-addr that is
// no address is said before PostgreSQL or Kafka start.
func TestBadMetricsAddrStopsBeforeAnythingStarts(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lakeflow.toml")
	if err := os.WriteFile(file, []byte("data_dir = \"data\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := newApp().Run([]string{"lakeflow", "--config", file, "run", "--metrics-addr", "9464"})
	if exitCode(err) != exitConfig || !strings.Contains(fmt.Sprint(err), `--metrics-addr "9464": want host:port`) {
		t.Fatalf("run --metrics-addr 9464: exit %d, %v", exitCode(err), err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "pg")); !os.IsNotExist(err) {
		t.Fatalf("the embedded PostgreSQL was set up before the address was checked (%v)", err)
	}
}

// TestRefreshOfNoMartStopsBeforeAnythingStarts: a gold.refresh entry
// naming no mart is said, with the marts there are, before PostgreSQL or
// Kafka start.
func TestRefreshOfNoMartStopsBeforeAnythingStarts(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lakeflow.toml")
	if err := os.WriteFile(file, []byte("data_dir = \"data\"\n[gold.refresh]\ndaily_revenu = \"1m\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := newApp().Run([]string{"lakeflow", "--config", file, "run"})
	if exitCode(err) != exitConfig || !strings.Contains(fmt.Sprint(err), "gold.refresh.daily_revenu: there is no mart daily_revenu (did you mean daily_revenue?)") ||
		!strings.Contains(fmt.Sprint(err), "daily_revenue") {
		t.Fatalf("run with gold.refresh of no mart: exit %d, %v", exitCode(err), err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "pg")); !os.IsNotExist(err) {
		t.Fatalf("the embedded PostgreSQL was set up before gold.refresh was checked (%v)", err)
	}
}

// TestArgumentStartingWithADash: a query that begins with a -- comment
// is taken for a flag by the flag parser; the error says to put -- first.
func TestArgumentStartingWithADash(t *testing.T) {
	err := newApp().Run([]string{"lakeflow", "sql", "-- the newest orders\nSELECT 1"})
	if exitCode(err) != exitConfig || !strings.Contains(fmt.Sprint(err), `"-- the newest orders" is not a flag (it holds a space): an argument that starts with - goes after -- (lakeflow sql [flags] -- '<argument>')`) {
		t.Fatalf("lakeflow sql '-- …': exit %d, %v", exitCode(err), err)
	}
	if err := newApp().Run([]string{"lakeflow", "sql", "--nosuch"}); !strings.Contains(fmt.Sprint(err), "flag provided but not defined: -nosuch") {
		t.Fatalf("lakeflow sql --nosuch: %v", err)
	}
}

// TestBackfillOfDaysSaysWhatItDid: backfill --from/--to prints a line of
// what it replaced, as --all does; nothing when the lake held none of the
// days (a warning said so).
func TestBackfillOfDaysSaysWhatItDid(t *testing.T) {
	from, to := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
	st := pipeline.BackfillStats{Path: "w.duckdb", Seconds: 1.5, Slice: warehouse.SliceStats{Keys: 12, Marts: 3}}
	st.Events = 900
	for want, opts := range map[string]pipeline.BackfillOptions{
		"backfilled 2026-11-02 to 2026-11-03 in w.duckdb: 12 keys' silver rows replaced (and their history), 3 marts recomputed, in 1.50 s (the lake's 900 events replayed whole)": {From: from, To: to},
		"recomputed gold.daily_revenue for 2026-11-02 to 2026-11-03 in w.duckdb in 1.50 s":                                                                                         {From: from, To: to, Mart: "daily_revenue"},
	} {
		if got := backfillSummary(opts, st); got != want {
			t.Errorf("backfillSummary(%+v) = %q, want %q", opts, got, want)
		}
	}
	st.From = 777
	want := "backfilled 2026-11-02 to 2026-11-03 in w.duckdb: 12 keys' silver rows replaced (and their history), 3 marts recomputed, in 1.50 s (the lake's state checkpoint at _cdc_seq 777 and the 900 events after it replayed)"
	if got := backfillSummary(pipeline.BackfillOptions{From: from, To: to}, st); got != want {
		t.Errorf("a backfill of days from a checkpoint printed %q, want %q", got, want)
	}
	st.Unpublished = true
	if got := backfillSummary(pipeline.BackfillOptions{From: from, To: to}, st); !strings.HasSuffix(got, "replayed); the live warehouse ends inside a source transaction, so warehouse.path keeps its copy until the next lakeflow run completes it") {
		t.Errorf("a backfill of days left unpublished printed %q", got)
	}
	if got := backfillSummary(pipeline.BackfillOptions{From: from, To: to}, pipeline.BackfillStats{Empty: true}); got != "" {
		t.Errorf("a backfill of days the lake lacks printed %q", got)
	}
}

// TestFinalErrorFollowsTheLogFormat: with --log-format json (however
// written, and whatever ended the command: a usage error too) the error
// a command ends with is one more JSON record, exit code and all, even
// under --log-level above error; without, one plain line.
func TestFinalErrorFollowsTheLogFormat(t *testing.T) {
	for args, want := range map[string]bool{
		"lakeflow --log-format json run":               true,
		"lakeflow run --log-format=json --log-level x": true,
		"lakeflow -log-format json status":             true,
		"lakeflow --log-format text run":               false,
		"lakeflow sql -- --log-format json":            false,
		"lakeflow run":                                 false,
	} {
		if got := jsonAsked(strings.Fields(args)); got != want {
			t.Errorf("jsonAsked(%q) = %t, want %t", args, got, want)
		}
	}
	err := newApp().Run([]string{"lakeflow", "--log-format", "json", "--log-level", "error+4", "status", "--nosuch"})
	if err == nil {
		t.Fatal("status --nosuch: no error")
	}
	var out strings.Builder
	reportError(&out, true, err)
	var rec struct {
		Level, Msg, Err string
		Exit            int
	}
	if jerr := json.Unmarshal([]byte(out.String()), &rec); jerr != nil || rec.Level != "ERROR" || rec.Err != fault.OneLine(err.Error()) || rec.Exit != exitCode(err) {
		t.Fatalf("the final error as JSON: %q (%v)", out.String(), jerr)
	}
	out.Reset()
	reportError(&out, false, err)
	if want := "lakeflow: " + fault.OneLine(err.Error()) + "\n"; out.String() != want {
		t.Fatalf("the final error as text: %q, want %q", out.String(), want)
	}
}

// TestCheckReportIsABlockPerFinding: each finding is a heading line
// (severity · part · check · dataset · count), what was found with its
// examples, and the fix; then the summary line.
func TestCheckReportIsABlockPerFinding(t *testing.T) {
	r := &pipeline.CheckReport{Passed: map[string]int{"data": 4, "catalog": 2}, Seconds: 1.25, Findings: []pipeline.Finding{
		{Part: "data", Check: "orders.total_matches_items", Severity: "error", Dataset: "silver.orders", Count: 2,
			Examples: []string{"7: 500 ≠ 450", "9: 10 ≠ 12"}, Message: "An order's total is the sum of its lines.", Fix: "correct the rows named"},
		{Part: "catalog", Check: "catalog.owner", Severity: "warning", Message: "gold.x has no owner"},
		{Part: "contracts", Check: "contracts.valid", Severity: "error", Message: "a.toml:2: bad\nb.toml:5: worse", Fix: "correct them"},
	}}
	var out strings.Builder
	if err := printReport(&out, r); err != nil {
		t.Fatal(err)
	}
	want := `error · data · orders.total_matches_items · silver.orders · 2
  An order's total is the sum of its lines; e.g. 7: 500 ≠ 450, 9: 10 ≠ 12
  fix: correct the rows named

warning · catalog · catalog.owner
  gold.x has no owner

error · contracts · contracts.valid
  a.toml:2: bad
  b.toml:5: worse
  fix: correct them

6 checks passed, 2 failed, 1 warnings (1.2 s)
`
	if out.String() != want {
		t.Fatalf("check printed\n%s\nwant\n%s", out.String(), want)
	}
}
