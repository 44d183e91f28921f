package lake

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestPublishSyncsEveryDirectoryItChanges: a file is durable only once
// the directory entries leading to it are: the staging directory before
// the batch commits, and after the rename every directory a name was
// added to, including those created for it.
func TestPublishSyncsEveryDirectoryItChanges(t *testing.T) {
	root := t.TempDir()
	l, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	var synced []string
	l.sync = func(p string) error {
		synced = append(synced, p)
		return nil
	}
	f := l.NewFile("orders", "2024-02-29", Span{Partition: 0, First: 0, Last: 9, MinSeq: 0x10, MaxSeq: 0x20})
	if err := os.WriteFile(f.Staging, []byte("parquet"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncStaging(); err != nil {
		t.Fatal(err)
	}
	if err := l.Publish([]File{f}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		filepath.Join(root, stagingDir), // the staged name
		root,                            // gained orders/
		filepath.Join(root, "orders"),   // gained date=2024-02-29/
		filepath.Join(root, "orders", "date=2024-02-29"), // gained the file
	} {
		if !slices.Contains(synced, want) {
			t.Errorf("%s was not synced (synced: %v)", want, synced)
		}
	}
	if _, err := os.Stat(filepath.Join(root, f.Path)); err != nil {
		t.Fatal(err)
	}
	high, err := l.HighOffsets("orders")
	if err != nil || high[0] != 9 {
		t.Fatalf("high offsets %v (%v), want partition 0 at 9", high, err)
	}
}

// TestSwapsWaitForReaders: a swap is refused (without wait) while a
// reader holds the lake's files, and taken once it lets go.
func TestSwapsWaitForReaders(t *testing.T) {
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	release, err := l.HoldFiles()
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.HoldFiles()
	if err != nil {
		t.Fatal("a second reader waits:", err)
	}
	if _, err := l.LockSwaps(false); !errors.Is(err, ErrReadersHold) {
		t.Fatalf("a swap while readers hold the lake: %v, want ErrReadersHold", err)
	}
	release()
	other()
	unlock, err := l.LockSwaps(false)
	if err != nil {
		t.Fatalf("a swap once the readers let go: %v", err)
	}
	unlock()
}

// TestExchangeByRenamesFinishesAfterACrash: an exchange by three renames
// killed after the first or the second is finished, the day holding the
// built files and the built directory the old ones.
func TestExchangeByRenamesFinishesAfterACrash(t *testing.T) {
	for _, renames := range []int{1, 2} {
		l, err := Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		day, built := l.DayDir("t", "2026-12-07"), l.CompactDir("t~2026-12-07~1")
		for dir, name := range map[string]string{day: "old", built: "new"} {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// The renames exchangeByRenames does, the crash after renames of them.
		steps := [][2]string{{day, built + exchanging}, {built, day}}
		for _, s := range steps[:renames] {
			if err := os.Rename(s[0], s[1]); err != nil {
				t.Fatal(err)
			}
		}
		if ids, err := l.CompactIDs(); err != nil || len(ids) != 1 || ids[0] != "t~2026-12-07~1" {
			t.Fatalf("after %d renames the compactions are %v (%v)", renames, ids, err)
		}
		if err := l.FinishExchange("t", "2026-12-07", "t~2026-12-07~1"); err != nil {
			t.Fatal(err)
		}
		for dir, name := range map[string]string{day: "new", built: "old"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				t.Errorf("after %d renames and the finish: %v", renames, err)
			}
		}
	}
}

// TestExchangeIntoAMissingDay: a recorded compaction whose day directory
// was removed by hand since is swapped in all the same (the built day
// takes its place), not refused at every start.
func TestExchangeIntoAMissingDay(t *testing.T) {
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	day, built := l.DayDir("t", "2026-12-07"), l.CompactDir("t~2026-12-07~1")
	if err := os.MkdirAll(built, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(built, "new"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(day), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := l.Exchange("t", "2026-12-07", "t~2026-12-07~1"); err != nil {
		t.Fatalf("exchange into a missing day: %v", err)
	}
	if _, err := os.Stat(filepath.Join(day, "new")); err != nil {
		t.Fatalf("the built day is not in place: %v", err)
	}
	if err := l.RemoveCompaction("t~2026-12-07~1"); err != nil {
		t.Fatalf("removing the compaction after: %v", err)
	}
}

// TestCopyClonesWhereTheFileSystemCan: on XFS (a loop-mounted image) a
// copy is a clone, whose writes leave the original as it was; on the
// test's own directory, whatever it is, a copy holds the same bytes.
func TestCopyClonesWhereTheFileSystemCan(t *testing.T) {
	mkfs, err := exec.LookPath("mkfs.xfs")
	if err != nil {
		t.Fatal("mkfs.xfs is missing (scripts/test installs xfsprogs)")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "xfs.img"), filepath.Join(dir, "mnt")
	for _, cmd := range [][]string{{"truncate", "-s", "320M", img}, {mkfs, "-q", "-m", "reflink=1", img}, {"mkdir", mnt}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v (this test mounts an XFS image, which needs root): %v\n%s", cmd, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	data := bytes.Repeat([]byte("lakeflow"), 1<<17)
	for _, d := range []string{mnt, dir} {
		src, dst := filepath.Join(d, "live.duckdb"), filepath.Join(d, "copy.duckdb")
		if err := os.WriteFile(src, data, 0o644); err != nil {
			t.Fatal(err)
		}
		cloned, err := Copy(src, dst)
		if err != nil {
			t.Fatal(err)
		}
		if d == mnt && !cloned {
			t.Errorf("a copy on XFS was not a clone")
		}
		if err := os.WriteFile(dst, []byte("changed"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(src); !bytes.Equal(got, data) {
			t.Errorf("writing the copy in %s changed the original (cloned %v)", d, cloned)
		}
	}
}
