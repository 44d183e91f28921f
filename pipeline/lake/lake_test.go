package lake

import (
	"os"
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
