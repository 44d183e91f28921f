package pipeline

import (
	"context"
	"errors"
	"fmt"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/warehouse"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/internal/crash"
	"github.com/lakeflow/lakeflow/internal/lake"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestCompactionKeepsEveryAnswer: runs that each write a batch leave a
// day of small lake files, under two schemas; lakeflow compact merges
// them, and asof at every batch (by batch, LSN and commit time) and at a
// Kafka record, and a rebuild from the lake alone, answer as before. The
// lake holds every event once, lakeflow.lake_files lists the files the
// lake holds, and the pipeline goes on over the merged files.
func TestCompactionKeepsEveryAnswer(t *testing.T) {
	ctx := context.Background()
	h := smallFilesLake(t, 6)
	lk, err := lake.OpenExisting(h.cfg.Lake.Dir)
	if err != nil {
		t.Fatal(err)
	}
	files := func(table string) int {
		parts, err := lk.Parts(table)
		if err != nil {
			t.Fatal(err)
		}
		return len(parts)
	}
	beforeT, beforeU := files("t"), files("u")
	if beforeT < 7 || beforeU < 7 {
		t.Fatalf("the runs left %d files of t and %d of u, want a file a run: the test proves nothing", beforeT, beforeU)
	}
	batches, err := AsOfBatches(ctx, h.cfg, 100, h.log)
	if err != nil || len(batches) < 7 {
		t.Fatalf("%d batches named by the lake (%v)", len(batches), err)
	}
	// The first, a middle and the last batch, each in two forms, and a
	// commit time and a Kafka record.
	var positions []string
	for _, b := range []int{0, len(batches) / 2, len(batches) - 1} {
		positions = append(positions, fmt.Sprintf("batch:%d", batches[b].Batch), batches[b].Seq.String())
	}
	if c := batches[len(batches)/2].Commit; !c.IsZero() {
		positions = append(positions, c.Format(time.RFC3339Nano))
	}
	positions = append(positions, h.cfg.Kafka.TopicPrefix+".public.t:0:305")
	asof := func(when string) []string {
		var out []string
		for i, pos := range positions {
			path := filepath.Join(h.dir, fmt.Sprintf("asof-%s-%d.duckdb", when, i))
			a, err := BuildAsOf(ctx, h.cfg, AsOfOptions{Position: pos, Out: path}, h.log)
			if err != nil {
				t.Fatalf("asof %s %s: %v", when, pos, err)
			}
			a.Close()
			out = append(out, path)
		}
		return out
	}
	before := asof("before")
	rebuiltBefore := backfillFromLakeAlone(t, h)

	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	st, err := Compact(ctx, h.cfg, CompactOptions{Before: tomorrow}, h.log)
	if err != nil {
		t.Fatal(err)
	}
	if st.Days != 2 || files("t") != 2 || files("u") != 1 {
		t.Fatalf("compacted %+v: t has %d files (one per schema wanted), u %d", st, files("t"), files("u"))
	}
	// It wrote a state checkpoint, which the as-of states at the lake's
	// end below start from.
	if !st.Checkpoint.Written || st.CheckpointErr != nil {
		t.Fatalf("lakeflow compact wrote no state checkpoint: %+v, %v", st.Checkpoint, st.CheckpointErr)
	}
	for i, path := range asof("after") {
		t.Run(positions[i], func(t *testing.T) { assertSameSilver(t, before[i], path, "t", "u") })
	}
	assertSameSilver(t, rebuiltBefore, backfillFromLakeAlone(t, h), "t", "u")
	assertLakeExactlyOnce(t, h.cfg, "public.t", "public.u")
	listed := queryText(t, h.cfg.Warehouse.Path, "SELECT string_agg(path, ',' ORDER BY path) FROM lakeflow.lake_files WHERE source_table IN ('public.t', 'public.u')")
	var onDisk []string
	for _, table := range []string{"t", "u"} {
		parts, _ := lk.Parts(table)
		for _, p := range parts {
			onDisk = append(onDisk, p.Path)
		}
	}
	if listed != strings.Join(onDisk, ",") {
		t.Fatalf("lakeflow.lake_files lists %s, the lake holds %s", listed, strings.Join(onDisk, ","))
	}

	// The pipeline goes on; a second compaction merges the new files
	// into the day's.
	pgtest.Exec(t, h.dsn, `UPDATE t SET v = -v WHERE id < 50`, `DELETE FROM u WHERE id = 1`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t", "public.u")
	rebuiltBefore = backfillFromLakeAlone(t, h)
	if _, err := Compact(ctx, h.cfg, CompactOptions{Before: tomorrow}, h.log); err != nil {
		t.Fatal(err)
	}
	if files("u") != 1 {
		t.Fatalf("u has %d files after a second compaction", files("u"))
	}
	assertLakeExactlyOnce(t, h.cfg, "public.t", "public.u")
	assertSameSilver(t, rebuiltBefore, backfillFromLakeAlone(t, h), "t", "u")
}

// smallFilesLake makes a lake of many small files: tables t and u, a
// snapshot, then runs runs that each change both (t gains a column with a
// default after half of them).
func smallFilesLake(t *testing.T, runs int) *harness {
	t.Helper()
	h := newHarness(t, "public.t", "public.u")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int, note text)`, `INSERT INTO t SELECT g, g, 'n' || g FROM generate_series(1, 300) g`,
		`CREATE TABLE u (id int PRIMARY KEY)`, `INSERT INTO u SELECT generate_series(1, 10)`)
	h.run(t, Options{})
	for i := range runs {
		if i == runs/2 {
			pgtest.Exec(t, h.dsn, `ALTER TABLE t ADD COLUMN x int DEFAULT 7`)
		}
		pgtest.Exec(t, h.dsn, fmt.Sprintf(`UPDATE t SET v = v + 1 WHERE id %% 7 = %d`, i), fmt.Sprintf(`INSERT INTO t (id, v, note) VALUES (%d, %d, 'new')`, 1000+i, i),
			fmt.Sprintf(`DELETE FROM t WHERE id = %d`, 10+i), fmt.Sprintf(`INSERT INTO u VALUES (%d)`, 100+i))
		h.run(t, Options{})
	}
	return h
}

// TestKillDuringCompaction: lakeflow compact is killed (SIGKILL) after it
// recorded a day's merged files, before the rename that puts them in the
// lake, and after that rename; the next lakeflow compact, or lakeflow
// run, finishes it. The lake holds every event once, and a rebuild from
// it answers as before.
func TestKillDuringCompaction(t *testing.T) {
	bin := lakeflowFaultBinary(t)
	h := smallFilesLake(t, 2)
	rebuilt := backfillFromLakeAlone(t, h)
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	for _, point := range []string{crash.CompactRecorded, crash.CompactSwapped} {
		out, err := lakeflowCmdAt(t, bin, point, "--config", h.file, "compact", "--before", tomorrow).CombinedOutput()
		if !diedAt(err, out, point) {
			t.Fatalf("lakeflow compact did not die at %s: %v\n%s", point, err, out)
		}
		if point == crash.CompactRecorded {
			if out, err := lakeflowCmd(t, "--config", h.file, "compact", "--before", tomorrow).CombinedOutput(); err != nil {
				t.Fatalf("lakeflow compact after the kill: %v\n%s", err, out)
			}
		} else {
			h.run(t, Options{})
		}
		assertLakeExactlyOnce(t, h.cfg, "public.t", "public.u")
		assertSameSilver(t, rebuilt, backfillFromLakeAlone(t, h), "t", "u")
		if left := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM lakeflow.compactions WHERE swapped_at IS NULL"); left != "0" {
			t.Fatalf("after the kill at %s, %s compactions are not finished", point, left)
		}
		// More small files for the next point to merge.
		pgtest.Exec(t, h.dsn, `INSERT INTO u VALUES (500)`, `DELETE FROM u WHERE id = 500`)
		h.run(t, Options{})
		rebuilt = backfillFromLakeAlone(t, h)
	}
}

// TestFollowCompactsBetweenBatches: lakeflow run --follow compacts the
// lake between its batches, a table-day a pass, while changes stream;
// silver, the lake and a rebuild from it agree with the source.
func TestFollowCompactsBetweenBatches(t *testing.T) {
	h := smallFilesLake(t, 3)
	h.cfg.Lake.CompactInterval = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- Run(ctx, h.cfg, Options{Follow: true, Workload: func(ctx context.Context, dsn string) error {
			for i := range 20 {
				if err := applySteps(ctx, dsn, [][]string{{fmt.Sprintf(`UPDATE t SET v = v * 2 WHERE id = %d`, 20+i), fmt.Sprintf(`INSERT INTO u VALUES (%d)`, 1000+i)}}); err != nil {
					return err
				}
				time.Sleep(300 * time.Millisecond)
			}
			return nil
		}}, h.log)
	}()
	waitFor(t, "two compaction passes", func() bool { return strings.Count(h.logs.String(), `msg="lake compacted"`) >= 2 })
	cancel()
	if err := waitStopped(t, errc); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t", "public.u")
	assertLakeExactlyOnce(t, h.cfg, "public.t", "public.u")
}

// TestCompactionKeepsWhatItDoesNotMerge: a file of the day that batches
// after the last consistent one wrote, or that lakeflow.lake_files does
// not list (a warehouse rebuilt from Kafka), is not merged and stays in
// the day the compaction swaps in.
func TestCompactionKeepsWhatItDoesNotMerge(t *testing.T) {
	for _, mode := range []string{"unsettled", "unlisted"} {
		t.Run(mode, func(t *testing.T) {
			h := smallFilesLake(t, 3)
			lk, err := lake.OpenExisting(h.cfg.Lake.Dir)
			if err != nil {
				t.Fatal(err)
			}
			parts, err := lk.Parts("u")
			if err != nil || len(parts) < 3 {
				t.Fatalf("u has %d files (%v): the test proves nothing", len(parts), err)
			}
			kept := parts[len(parts)-1].Path
			db := openDuckRW(t, h.cfg.Warehouse.Live)
			q := "UPDATE lakeflow.lake_files SET batch = 1000000000 WHERE path = ?"
			if mode == "unlisted" {
				q = "DELETE FROM lakeflow.lake_files WHERE path = ?"
			}
			if _, err := db.Exec(q, kept); err != nil {
				t.Fatal(err)
			}
			db.Close()
			tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
			st, err := Compact(context.Background(), h.cfg, CompactOptions{Before: tomorrow}, h.log)
			if err != nil || st.Replaced == 0 {
				t.Fatalf("compact: %+v, %v", st, err)
			}
			if _, err := os.Stat(lk.Abs(kept)); err != nil {
				t.Errorf("the %s file %s left the lake: %v", mode, kept, err)
			}
			glob := filepath.Join(h.cfg.Lake.Dir, "*", "*", "*.parquet")
			if n := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM parquet_schema('"+glob+"') WHERE name = 'date'"); n != "0" {
				t.Errorf("%s lake files hold a date column (the path's Hive partition, read as a column)", n)
			}
			assertLakeExactlyOnce(t, h.cfg, "public.t", "public.u")
		})
	}
}

// TestRefusedSwapStopsUntilTheFileSystemLetsIt: the file system refuses
// the swap of a recorded compaction (the table's directory immutable):
// lakeflow compact, then lakeflow run, stop in the environment's class
// saying so, and lakeflow run after the directory is writable again
// finishes the swap and goes on, nothing lost.
func TestRefusedSwapStopsUntilTheFileSystemLetsIt(t *testing.T) {
	h := smallFilesLake(t, 2)
	tableDir := filepath.Join(h.cfg.Lake.Dir, "u")
	if out, err := exec.Command("chattr", "+i", tableDir).CombinedOutput(); err != nil {
		t.Fatalf("chattr +i (this test needs root and a file system with attributes): %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", tableDir).Run() })
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	_, err := Compact(context.Background(), h.cfg, CompactOptions{Table: "public.u", Before: tomorrow}, h.log)
	if !errors.Is(err, fault.ErrEnvironment) || !errors.Is(err, warehouse.ErrSwapUnfinished) {
		t.Fatalf("lakeflow compact with the swap refused: %v, want the environment's class and the unfinished swap", err)
	}
	if err := Run(context.Background(), h.cfg, Options{}, h.log); !errors.Is(err, warehouse.ErrSwapUnfinished) {
		t.Fatalf("lakeflow run with the swap still refused: %v, want the unfinished swap", err)
	}
	if out, err := exec.Command("chattr", "-i", tableDir).CombinedOutput(); err != nil {
		t.Fatalf("chattr -i: %v\n%s", err, out)
	}
	pgtest.Exec(t, h.dsn, `INSERT INTO u VALUES (600)`)
	h.run(t, Options{})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t", "public.u")
	assertLakeExactlyOnce(t, h.cfg, "public.t", "public.u")
	if left := queryText(t, h.cfg.Warehouse.Path, "SELECT count(*) FROM lakeflow.compactions WHERE swapped_at IS NULL"); left != "0" {
		t.Fatalf("%s compactions left unfinished after the run", left)
	}
}

// TestBoundedPassesTakeTablesInTurn: run --follow's pass merges one
// table-day; the next begins after the table the last merged, so a table
// that gets small files every batch cannot take every pass (an aging run
// under a steady load left another table-day at a file a batch).
func TestBoundedPassesTakeTablesInTurn(t *testing.T) {
	h := smallFilesLake(t, 3)
	lk, err := lake.Open(h.cfg.Lake.Dir)
	if err != nil {
		t.Fatal(err)
	}
	wh, err := openLive(context.Background(), h.cfg, lk, h.log, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	var order []string
	for _, after := range []string{"public.t", "public.u"} {
		st, err := wh.Compact(context.Background(), warehouse.CompactOptions{Before: tomorrow, Target: h.cfg.Lake.CompactTarget, Grace: time.Hour,
			MaxDays: 1, MaxBytes: h.cfg.Lake.CompactTarget, Incremental: true, After: after})
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, st.Last)
	}
	if got := strings.Join(order, " "); got != "public.u public.t" {
		t.Fatalf("bounded passes after public.t, then after public.u, merged a day of %q, want public.u, then public.t (round again)", got)
	}
}

// TestCompactNamesTheMartToCorrect: lakeflow compact publishes its copy
// with the marts as of its silver, so a mart file lakeflow cannot read
// stops it before anything is merged, naming the file; once the file
// is corrected, lakeflow compact merges and publishes.
func TestCompactNamesTheMartToCorrect(t *testing.T) {
	h := smallFilesLake(t, 2)
	dir := t.TempDir()
	h.cfg.Gold.Dir, h.cfg.Gold.DirSet = dir, true
	bad := filepath.Join(dir, "broken.sql")
	if err := os.WriteFile(bad, []byte("-- gold.broken: no grain\nSELECT 1 AS x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lk, err := lake.OpenExisting(h.cfg.Lake.Dir)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := lk.Parts("u")
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format(time.DateOnly)
	_, err = Compact(context.Background(), h.cfg, CompactOptions{Before: tomorrow}, h.log)
	after, _ := lk.Parts("u")
	if !errors.Is(err, fault.ErrConfig) || !strings.Contains(err.Error(), "broken.sql") || len(after) != len(before) {
		t.Fatalf("lakeflow compact with a mart it cannot read: %v, u's files %d → %d; want a configuration error naming broken.sql, nothing merged", err, len(before), len(after))
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	st, err := Compact(context.Background(), h.cfg, CompactOptions{Before: tomorrow}, h.log)
	if err != nil || st.Days == 0 {
		t.Fatalf("lakeflow compact once the mart is corrected: %+v, %v", st.CompactStats, err)
	}
}
