package pipeline

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

var (
	crashKills = flag.Int("kills", 33, "how many times TestCrashLoop kills the pipeline (scripts/crashloop: 1000)")
	crashDoc   = flag.String("crash-doc", "", "TestCrashLoop writes its result, as Markdown, to this file")
)

var (
	faultBinaryOnce sync.Once
	faultBinaryPath string
	faultBinaryErr  error
)

// lakeflowFaultBinary builds the command with its crash points
// (-tags faults) once.
func lakeflowFaultBinary(t *testing.T) string {
	t.Helper()
	lakeflowBinary(t) // for binaryDir, removed with it
	faultBinaryOnce.Do(func() {
		faultBinaryPath = filepath.Join(binaryDir, "lakeflow-faults")
		out, err := exec.Command("go", "build", "-tags", "faults", "-o", faultBinaryPath, "github.com/lakeflow/lakeflow").CombinedOutput()
		if err != nil {
			faultBinaryErr = fmt.Errorf("go build -tags faults: %v\n%s", err, out)
		}
	})
	if faultBinaryErr != nil {
		t.Fatal(faultBinaryErr)
	}
	return faultBinaryPath
}

// journalContract accepts, ahead, the rename the workload makes.
const journalContract = `table = "public.journal"
key = ["id"]
[[columns]]
name = "id"
type = "bigint"
[[columns]]
name = "kind"
type = "integer"
[[columns]]
name = "amount"
type = "bigint"
[[columns]]
name = "memo"
type = "text"
renamed_from = "note"
[[rules]]
name = "amount_non_negative"
check = "amount >= 0"
`

// journalSteps are the crash loop's changes beside the shop's: schema
// changes (a column added with a default, one widened, one renamed under
// the contract), rule breakers, a truncate and a transaction larger than
// batch_bytes, one step after each fifth of the shop's workload.
var journalSteps = [][]string{
	{`INSERT INTO journal SELECT g, g % 5, g * 10, 'n' || g FROM generate_series(1, 2000) g`,
		`UPDATE journal SET amount = -1 WHERE id % 97 = 0`},
	{`ALTER TABLE journal ADD COLUMN extra text DEFAULT 'x'`, `UPDATE journal SET extra = 'y', kind = kind + 1 WHERE id % 7 = 0`},
	{`ALTER TABLE journal ALTER COLUMN amount TYPE bigint`, `UPDATE journal SET amount = amount * 3000000 WHERE id % 5 = 0`},
	{`INSERT INTO journal SELECT g, g % 3, g, 'big' FROM generate_series(10001, 90000) g`},
	{`TRUNCATE journal`, `INSERT INTO journal SELECT g, 1, g, 'again' FROM generate_series(1, 500) g`},
	{`ALTER TABLE journal RENAME COLUMN note TO memo`, `UPDATE journal SET memo = 'm' || id WHERE id % 3 = 0`, `DELETE FROM journal WHERE id % 11 = 0`},
}

// TestCrashLoop kills `lakeflow run --follow` again and again — at each
// crash point in turn (a test build's, -tags faults) and at random
// moments — while a seeded workload of more than 50,000 changes runs,
// schema changes, rule breakers, a truncate, a transaction larger than
// batch_bytes and records that are not envelopes among them; once,
// `lakeflow backfill --all` dies before its swap. Then a run drains the
// WAL, and nothing may be lost or written twice: silver is the source
// (but for the changes rules held back), the history is the lake's
// versions, silver, history, quarantine and gold equal a clean backfill
// --all, quarantine and dead letters hold each change once, the lake
// each event once, the slot is confirmed to where the warehouse stands,
// and every copy of the warehouse a reader could open was consistent.
func TestCrashLoop(t *testing.T) {
	bin := lakeflowFaultBinary(t)
	began := time.Now()
	// A state checkpoint every 5 s of run --follow: kills land in their
	// builds too.
	h := newHarnessWith(t, "partitions = 3\n[warehouse]\npublish_interval = \"300ms\"\n[lake]\ncheckpoint_interval = \"5s\"",
		append(qualified(demoTables), "public.journal")...)
	// Batches of 1 MiB: the large transaction is applied in parts.
	setConfig(t, h, `batch_bytes = "4MiB"`, `batch_bytes = "1MiB"`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	useDemoContracts(t, h)
	if err := os.WriteFile(filepath.Join(h.cfg.Contracts.Dir, "journal.toml"), []byte(journalContract), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := demo.Setup(ctx, h.dsn); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, h.dsn, `CREATE TABLE journal (id bigint PRIMARY KEY, kind int, amount int, note text)`, `ALTER TABLE journal REPLICA IDENTITY FULL`)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	if keep := os.Getenv("CRASHLOOP_KEEP"); keep != "" {
		// A failed loop's data directory, for a look.
		t.Cleanup(func() {
			if t.Failed() {
				exec.Command("cp", "-r", h.dir, filepath.Join(keep, fmt.Sprint(seed))).Run()
			}
		})
	}
	rng := rand.New(rand.NewPCG(seed, 2))

	// The workload lasts about as long as the kills: a change every 2.5
	// ms, some 400 per kill.
	shopChanges := max(40000, 400**crashKills)
	const parts = 6
	workload := make(chan error, 1)
	var changes int
	go func() {
		workload <- func() error {
			for i := range parts {
				done, err := demo.Workload{Events: shopChanges / parts, Seed: seed + uint64(i), Rate: 400}.Run(ctx, h.dsn)
				changes += done.Changes
				if err != nil {
					return err
				}
				if err := applySteps(ctx, h.dsn, [][]string{journalSteps[i]}); err != nil {
					return fmt.Errorf("journal step %d: %w", i, err)
				}
			}
			return nil
		}()
	}()

	hits := map[string]int{}
	points := slices.Clone(crash.Points)
	points = slices.DeleteFunc(points, func(p string) bool {
		return p == crash.Snapshot || p == crash.Swap || p == crash.CompactRecorded || p == crash.CompactSwapped || p == crash.CheckpointBuilt
	})
	// lakeflow compact dies once at each of its points, at a quarter,
	// five eighths and three quarters of the loop: the next run finishes
	// its compaction, the next build of a checkpoint begins again.
	compactAt := map[int]string{}
	if *crashKills >= 8 {
		compactAt = map[int]string{*crashKills / 4: crash.CompactRecorded, 5 * *crashKills / 8: crash.CheckpointBuilt, 3 * *crashKills / 4: crash.CompactSwapped}
	}
	var random, unreached, rotation int
	for kill := 0; kill < *crashKills; kill++ {
		select {
		case err := <-workload:
			if err != nil {
				t.Fatal(err)
			}
			workload = nil
		default:
		}
		if workload == nil {
			// The workload is done: a few changes, so that batches come.
			if _, err := (demo.Workload{Events: 30, Seed: seed + uint64(1000+kill)}).Run(ctx, h.dsn); err != nil {
				t.Fatal(err)
			}
		}
		if kill == *crashKills/3 {
			// Records that are not envelopes, on a table topic.
			writeGarbage(t, h, "payments", [][]byte{[]byte("not json"), []byte(`{"op":"c"}`)})
		}
		if point := compactAt[kill]; point != "" {
			before := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
			if point == crash.CheckpointBuilt {
				// The days before today (none: the loop's changes are
				// all today's): nothing merged, so the kills at the
				// merge's points after it still find today's files.
				before = time.Now().UTC().Format(time.DateOnly)
			}
			out, err := lakeflowCmdAt(t, bin, point, "--config", h.file, "compact", "--before", before).CombinedOutput()
			if err != nil {
				if !diedAt(err, out, point) {
					t.Fatalf("lakeflow compact did not die at %s: %v\n%s", point, err, out)
				}
				hits[point]++
				continue
			}
			// Nothing to merge yet (the lake's files so far are one per
			// table-day, or none is settled): this kill's run goes on,
			// and makes files for the next try, at the next kill that
			// has nothing else of its own.
			next := kill + 1
			for compactAt[next] != "" || next == *crashKills/2 {
				next++
			}
			compactAt[next] = point
			t.Logf("kill %d: lakeflow compact found nothing to merge, again at kill %d:\n%s", kill, next, out)
		}
		var point string
		switch {
		case kill == 0:
			point = crash.Snapshot
		case kill == *crashKills/2:
			// The rebuild dies before its swap: the live warehouse stays.
			if out, err := lakeflowCmdAt(t, bin, crash.Swap, "--config", h.file, "backfill", "--all").CombinedOutput(); !diedAt(err, out, crash.Swap) {
				t.Fatalf("lakeflow backfill --all did not die at %s: %v\n%s", crash.Swap, err, out)
			}
			hits[crash.Swap]++
			continue
		case kill%3 == 2:
			random++ // a random moment
		default:
			point = points[rotation%len(points)]
			rotation++
		}
		p := startAt(t, h, bin, point, 1+rng.IntN(3))
		if point == "" {
			time.Sleep(time.Duration(300+rng.IntN(2000)) * time.Millisecond)
			p.kill(t)
		} else if p.died(t, point, 20*time.Second) {
			hits[point]++
		} else {
			unreached++
		}
		assertPublishedConsistent(t, h)
	}
	if workload != nil {
		if err := <-workload; err != nil {
			t.Fatal(err)
		}
	}
	// One more transaction larger than batch_bytes, while run --follow
	// reads it live, so that it is applied in parts (the loop's may have
	// come after a kill, as a backlog, in one), and a kill in the middle.
	// The run has applied what the loop left first, and builds no
	// checkpoint meanwhile (the first comes 10 minutes after a start): a
	// run still draining a backlog, or replaying the lake beside a loaded
	// suite, read the transaction whole, in one batch.
	setConfig(t, h, `checkpoint_interval = "5s"`, `checkpoint_interval = "1h"`)
	p := start(t, h, "run", "--follow")
	p.waitStreaming(t)
	conn := pgtest.Connect(t, h.dsn)
	walEnd := walEndNow(t, conn)
	waitFor(t, "the run to apply what the loop left", func() bool {
		done, err := slotPast(conn, h.cfg.Source.Slot, walEnd)
		return err == nil && done
	})
	before := strings.Count(h.logs.String(), "consistent=false")
	pgtest.Exec(t, h.dsn, `INSERT INTO journal SELECT g, g % 3, g, 'big' FROM generate_series(100001, 180000) g`)
	waitFor(t, "a batch holding part of the large transaction", func() bool { return strings.Count(h.logs.String(), "consistent=false") > before })
	p.kill(t)
	cancel()
	end := walEndNow(t, conn)
	p = start(t, h, "run")
	if err := p.wait(t); err != nil {
		t.Fatalf("the final lakeflow run: %v", err)
	}
	if caughtUp, err := slotPast(conn, h.cfg.Source.Slot, end); err != nil || !caughtUp {
		t.Errorf("the slot is not confirmed past %s, where the WAL ended before the last run (%v)", end, err)
	}
	tables := append(slices.Clone(demoTables), "journal")
	assertSilverEqualsSourceExcept(t, h.dsn, h.cfg.Warehouse.Path, heldBack(t, h.cfg.Warehouse.Path, qualified(tables)...), tables...)
	assertLakeExactlyOnce(t, h.cfg, tables...)
	rebuilt := filepath.Join(h.dir, "rebuilt.duckdb")
	if _, err := Backfill(context.Background(), h.cfg, BackfillOptions{All: true, Out: rebuilt}, h.log); err != nil {
		t.Fatal(err)
	}
	db := attachBoth(t, h.cfg.Warehouse.Path, rebuilt)
	defer db.Close()
	assertSameSilver(t, h.cfg.Warehouse.Path, rebuilt, tables...)
	for _, table := range []string{"silver.customers_history", "gold.daily_revenue", "gold.product_ranks", "gold.customer_ltv"} {
		assertSameRows(t, db, table, "*")
	}
	// The rebuild's quarantined rows have the newest schema's columns.
	assertSameRows(t, db, "lakeflow.quarantine", `* EXCLUDE (quarantined_at, "row")`)
	assertHistoryEqualsLake(t, db, h.cfg.Lake.Dir)
	var dupQuarantine, dead, deadInLake int64
	queryRow(t, db, `SELECT count(*) FROM (SELECT source_table, key, _cdc_seq, _cdc_ord FROM a.lakeflow.quarantine GROUP BY ALL HAVING count(*) > 1)`, &dupQuarantine)
	queryRow(t, db, `SELECT count(*) FROM a.lakeflow.dlq`, &dead)
	deadGlob := filepath.Join(h.cfg.Lake.Dir, "_dlq", "*", "*", "*.parquet")
	queryRow(t, db, `SELECT count(DISTINCT (topic, "partition", "offset")) FROM read_parquet(?)`, &deadInLake, deadGlob)
	var deadFiles int64
	queryRow(t, db, `SELECT count(*) FROM read_parquet(?)`, &deadFiles, deadGlob)
	if dupQuarantine != 0 || dead != 2 || deadInLake != 2 || deadFiles != 2 {
		t.Errorf("%d quarantined changes are there twice; lakeflow.dlq holds %d dead letters, the lake %d (%d distinct), want the 2 written once",
			dupQuarantine, dead, deadFiles, deadInLake)
	}
	for _, point := range crash.Points {
		if hits[point] == 0 {
			t.Errorf("no kill at crash point %s", point)
		}
	}
	var split int64
	queryRow(t, db, "SELECT count(*) FROM a.lakeflow.batches WHERE NOT consistent", &split)
	if split == 0 {
		t.Error("no batch held part of a transaction: the large one was never split")
	}
	assertCheckpointedAsOf(t, h, bin, seed, tables)
	result := "passed"
	if t.Failed() {
		result = "FAILED"
	}
	report := crashReport(*crashKills, random, unreached, hits, changes, time.Since(began), seed, result)
	t.Log(report)
	if *crashDoc != "" {
		if err := replaceSection(*crashDoc, "crashloop", report); err != nil {
			t.Fatal(err)
		}
	}
}

// walEndNow is the source's WAL position now.
func walEndNow(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var end string
	if err := conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	return end
}

// slotPast says whether the slot is confirmed at or past end: the
// pipeline applied what the source wrote before it.
func slotPast(conn *pgx.Conn, slot, end string) (bool, error) {
	var past bool
	err := conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2", end, slot).Scan(&past)
	return past, err
}

// assertCheckpointedAsOf: lakeflow compact writes a state checkpoint
// (from the newest the kills left that fits, if one does: the journal's
// schema changes make older ones not), a run applies changes after it,
// and the lake's latest state replayed from that checkpoint is the one
// replayed from the lake's start.
func assertCheckpointedAsOf(t *testing.T, h *harness, bin string, seed uint64, tables []string) {
	t.Helper()
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	if out, err := exec.Command(bin, "--config", h.file, "compact", "--before", tomorrow).CombinedOutput(); err != nil || !strings.Contains(string(out), "state checkpoint at") {
		t.Fatalf("lakeflow compact: %v\n%s", err, out)
	} else {
		t.Logf("%s", out)
	}
	if _, err := (demo.Workload{Events: 300, Seed: seed + 7777}).Run(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	if err := start(t, h, "run").wait(t); err != nil {
		t.Fatalf("lakeflow run: %v", err)
	}
	// asof by the binary that wrote the checkpoints: a checkpoint fits
	// the lakeflow build that wrote it.
	asof := func(name string) (from, events, at uint64, out string) {
		out = filepath.Join(h.dir, name)
		said, err := exec.Command(bin, "--config", h.file, "asof", lakeEnd, "--out", out).CombinedOutput()
		if err != nil {
			t.Fatalf("lakeflow asof: %v\n%s", err, said)
		}
		m := regexp.MustCompile(`\((\d+) events(?: after the lake's state checkpoint at _cdc_seq (\d+))? from`).FindSubmatch(said)
		if m == nil {
			t.Fatalf("lakeflow asof said %s", said)
		}
		events, _ = strconv.ParseUint(string(m[1]), 10, 64)
		from, _ = strconv.ParseUint(string(m[2]), 10, 64)
		db := openDuck(t, out)
		defer db.Close()
		queryRow(t, db, "SELECT _cdc_seq FROM lakeflow.asof", &at)
		return from, events, at, out
	}
	from, events, at, fromCheckpoint := asof("asof-checkpoint.duckdb")
	if from == 0 || events == 0 {
		t.Fatalf("the lake's latest state started from the checkpoint at %d and replayed %d events after it", from, events)
	}
	dir := filepath.Join(h.cfg.Lake.Dir, "_checkpoints")
	if err := os.Rename(dir, dir+".aside"); err != nil {
		t.Fatal(err)
	}
	fromStart, all, atWhole, whole := asof("asof-whole.duckdb")
	if fromStart != 0 || atWhole != at {
		t.Fatalf("asof without checkpoints: from %d, as of %d; with them, as of %d", fromStart, atWhole, at)
	}
	t.Logf("asof of the lake's end: %d events replayed after the checkpoint at %d, %d from the start", events, from, all)
	assertSameSilver(t, fromCheckpoint, whole, tables...)
	db := attachBoth(t, fromCheckpoint, whole)
	defer db.Close()
	assertSameRows(t, db, "silver.customers_history", "*")
	assertSameRows(t, db, "lakeflow.quarantine", "* EXCLUDE (quarantined_at)")
}

// replaceSection replaces what lies between the lines <!-- name --> and
// <!-- /name --> of the Markdown file at path with body, leaving the
// rest of the document as it is.
func replaceSection(path, name, body string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	open, end := "<!-- "+name+" -->\n", "<!-- /"+name+" -->"
	i, j := bytes.Index(doc, []byte(open)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("%s has no section %s (%s ... %s)", path, name, strings.TrimSpace(open), end)
	}
	out := slices.Concat(doc[:i+len(open)], []byte(body), doc[j:])
	return os.WriteFile(path, out, 0o644)
}

// setConfig replaces a line of the harness's configuration file.
func setConfig(t *testing.T, h *harness, old, new string) {
	t.Helper()
	body, err := os.ReadFile(h.file)
	if err == nil && !bytes.Contains(body, []byte(old)) {
		err = fmt.Errorf("no %q in %s", old, h.file)
	}
	if err == nil {
		err = os.WriteFile(h.file, bytes.Replace(body, []byte(old), []byte(new), 1), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// lakeflowCmdAt is the fault build of lakeflow with args, made to die at
// point (the n-th time it is reached; "": never).
func lakeflowCmdAt(t *testing.T, bin, point string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), crash.Env+"="+point)
	return cmd
}

// startAt starts `lakeflow run --follow` from the fault build, made to die
// at point the n-th time it is reached ("": never).
func startAt(t *testing.T, h *harness, bin, point string, n int) *process {
	t.Helper()
	cmd := lakeflowCmdAt(t, bin, fmt.Sprintf("%s@%d", point, n), "--config", h.file, "--log-level", "debug", "run", "--follow")
	return launch(t, h, cmd)
}

// died waits for the process to die at its crash point, as kill -9 does,
// and reports whether it did; one that does not in wait is killed.
func (p *process) died(t *testing.T, point string, wait time.Duration) bool {
	t.Helper()
	select {
	case err := <-p.exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("lakeflow run --follow, to die at %s, exited with %v", point, err)
		}
		return true
	case <-time.After(wait):
		p.kill(t)
		return false
	}
}

// diedAt says whether a command's run ended at the crash point.
func diedAt(err error, out []byte, point string) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL &&
		bytes.Contains(out, []byte("crash point "+point))
}

// assertPublishedConsistent checks the copy of the warehouse a reader
// opens, if there is one: it says it ends at a transaction boundary, and
// its gold is as of its silver.
func assertPublishedConsistent(t *testing.T, h *harness) {
	t.Helper()
	if _, err := os.Stat(h.cfg.Warehouse.Path); err != nil {
		return
	}
	query := func(q string) string {
		t.Helper()
		out, err := lakeflowCmd(t, "--config", h.file, "sql", "--format", "csv", q).CombinedOutput()
		if err != nil {
			t.Fatalf("lakeflow sql on the published warehouse: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return lines[len(lines)-1]
	}
	if query("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'gold' AND table_name = 'daily_revenue'") != "1" {
		return // a copy made before the first batch
	}
	const days = `SELECT lakeflow_utc_date(created_at), count(*) FROM silver.orders WHERE NOT _deleted GROUP BY ALL`
	if got := query(`SELECT (SELECT coalesce(consistent, true) FROM lakeflow.published), (SELECT count(*) FROM ((SELECT order_date, orders FROM gold.daily_revenue EXCEPT ALL ` + days + `)
			UNION ALL (` + days + ` EXCEPT ALL SELECT order_date, orders FROM gold.daily_revenue)))`); got != "true,0" {
		t.Errorf("the published warehouse (consistent, gold days off) is %s", got)
	}
}

// crashReport is the crash loop's result as Markdown.
func crashReport(kills, random, unreached int, hits map[string]int, changes int, took time.Duration, seed uint64, result string) string {
	var b strings.Builder
	commit := "unknown"
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
	}
	fmt.Fprintf(&b, "Run on %s at commit `%s`.\n\n", time.Now().UTC().Format("2006-01-02"), commit)
	fmt.Fprintf(&b, "| kills | at crash points | at random moments | crash point not reached (killed at random) | changes | wall time | seed | result |\n|---|---|---|---|---|---|---|---|\n")
	at := 0
	for _, n := range hits {
		at += n
	}
	fmt.Fprintf(&b, "| %d | %d | %d | %d | %d | %s | %d | %s |\n\n", kills, at, random, unreached, changes, took.Round(time.Second), seed, result)
	b.WriteString("| crash point | kills |\n|---|---|\n")
	for _, p := range crash.Points {
		fmt.Fprintf(&b, "| `%s` | %d |\n", p, hits[p])
	}
	return b.String()
}
