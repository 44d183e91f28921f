// Package lake is the bronze layer: immutable Parquet files at
// <dir>/<table>/date=YYYY-MM-DD/part-<min seq>-<max seq>-<partition>-<first offset>-<last offset>.parquet,
// one per table, commit day, Kafka partition and batch. The warehouse
// writes them (with DuckDB's COPY, before the batch's transaction; the
// transaction records them) under _staging/; this package names them,
// makes them durable, and publishes them to their final name only after
// that transaction has committed (DESIGN.md invariant 3).
package lake

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// The lake's own directories beside the tables'. A table whose
// directory would be one of them is refused (config.Tables).
const (
	stagingDir = "_staging"
	// DeadLetterDir holds the dead letters, one directory per topic.
	DeadLetterDir = "_dlq"
)

// Reserved says whether a table directory named dir would be one of the
// lake's own (file systems may ignore case).
func Reserved(dir string) bool {
	for _, own := range []string{stagingDir, DeadLetterDir, compactDir, checkpointDir} {
		if strings.EqualFold(dir, own) {
			return true
		}
	}
	return false
}

// Lake is a lake directory.
type Lake struct {
	dir string
	// sync makes a file or directory durable (a seam for tests).
	sync func(path string) error
}

// Open creates the lake directory if needed.
func Open(dir string) (*Lake, error) {
	if err := os.MkdirAll(filepath.Join(dir, stagingDir), 0o755); err != nil {
		return nil, fmt.Errorf("%w: create lake %s: %v", fault.ErrEnvironment, dir, err)
	}
	return &Lake{dir: dir, sync: syncPath}, nil
}

// OpenExisting opens a lake directory to read it only: nothing is
// created (lakeflow asof and check run beside the pipeline, and may read
// a lake they cannot write).
func OpenExisting(dir string) (*Lake, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("%w: no lake at %s (lake.dir): run lakeflow run first", fault.ErrConfig, dir)
	}
	return &Lake{dir: dir, sync: syncPath}, nil
}

// File is one lake file of a batch.
type File struct {
	Path    string // final path, relative to the lake root
	Staging string // absolute path to write it to first
}

// Span is what one lake file holds: a Kafka partition's offsets First to
// Last, whose events lie between the positions MinSeq and MaxSeq.
type Span struct {
	Partition   int32
	First, Last int64
	MinSeq      change.LSN
	MaxSeq      change.LSN
}

// NewFile names the file of a table's span committed on day (YYYY-MM-DD).
// The name is a function of its content, so a batch replayed after a
// crash rewrites the same name, never a second copy; it starts with the
// span's positions (16 hex digits each), so files sort in commit order
// and a reader can skip files by position from their names alone.
func (l *Lake) NewFile(table, day string, s Span) File {
	name := fmt.Sprintf("part-%016X-%016X-%d-%d-%d.parquet", uint64(s.MinSeq), uint64(s.MaxSeq), s.Partition, s.First, s.Last)
	rel := filepath.Join(table, "date="+day, name)
	return File{Path: rel, Staging: l.staging(rel)}
}

func (l *Lake) staging(rel string) string {
	return filepath.Join(l.dir, stagingDir, strings.ReplaceAll(rel, string(filepath.Separator), "~")+".staging")
}

// Abs returns the absolute path of a lake-relative path.
func (l *Lake) Abs(rel string) string { return filepath.Join(l.dir, rel) }

// Publish moves committed files to their final names, durably: every
// directory the names land in is synced, and a directory created for them
// is synced into its parent.
func (l *Lake) Publish(files []File) error {
	dirs := map[string]bool{}
	for _, f := range files {
		final := l.Abs(f.Path)
		if err := l.mkdirs(filepath.Dir(final), dirs); err != nil {
			return err
		}
		if err := os.Rename(f.Staging, final); err != nil {
			return fmt.Errorf("publish lake file %s: %w", f.Path, err)
		}
		dirs[filepath.Dir(final)] = true
	}
	for d := range dirs {
		if err := l.sync(d); err != nil {
			return err
		}
	}
	return nil
}

// mkdirs creates dir and its missing parents below the lake root, and
// marks the parents of the created ones for syncing.
func (l *Lake) mkdirs(dir string, dirty map[string]bool) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir && strings.HasPrefix(parent, l.dir) {
		if err := l.mkdirs(parent, dirty); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	dirty[filepath.Dir(dir)] = true
	return nil
}

// SyncStaging makes the staged files' names durable before the batch
// that lists them commits.
func (l *Lake) SyncStaging() error { return l.sync(filepath.Join(l.dir, stagingDir)) }

// Recover finishes what a crash interrupted: staged files of committed
// batches are published, those of uncommitted batches removed (their
// events are consumed again). committed says whether the warehouse
// recorded a final path.
func (l *Lake) Recover(committed func(path string) (bool, error)) (published, removed int, err error) {
	entries, err := os.ReadDir(filepath.Join(l.dir, stagingDir))
	if err != nil {
		return 0, 0, err
	}
	var publish []File
	for _, e := range entries {
		name := e.Name()
		staged := filepath.Join(l.dir, stagingDir, name)
		rel, ok := strings.CutSuffix(name, ".staging")
		if !ok || strings.HasPrefix(name, "tmp_") {
			// DuckDB's own temporary name for a COPY that did not finish.
			if err := os.Remove(staged); err != nil {
				return 0, 0, err
			}
			removed++
			continue
		}
		rel = strings.ReplaceAll(rel, "~", string(filepath.Separator))
		ok, err := committed(rel)
		if err != nil {
			return 0, 0, err
		}
		if ok {
			publish = append(publish, File{Path: rel, Staging: staged})
			continue
		}
		if err := os.Remove(staged); err != nil {
			return 0, 0, err
		}
		removed++
	}
	return len(publish), removed, l.Publish(publish)
}

var partName = regexp.MustCompile(`^part-([0-9A-F]{16})-([0-9A-F]{16})-(\d+)-(\d+)-(\d+)\.parquet$`)

// Part is a published file of a table.
type Part struct {
	Path string // relative to the lake root
	Day  string // YYYY-MM-DD
	Span Span
}

// Parts lists the published files of table (a directory of the lake) in
// commit order.
func (l *Lake) Parts(table string) ([]Part, error) {
	days, err := l.Days(table)
	if err != nil {
		return nil, err
	}
	var out []Part
	for _, day := range days {
		dir := "date=" + day
		files, err := os.ReadDir(filepath.Join(l.dir, table, dir))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			m := partName.FindStringSubmatch(f.Name())
			if m == nil {
				continue
			}
			minSeq, _ := strconv.ParseUint(m[1], 16, 64)
			maxSeq, _ := strconv.ParseUint(m[2], 16, 64)
			p, _ := strconv.Atoi(m[3])
			first, _ := strconv.ParseInt(m[4], 10, 64)
			last, _ := strconv.ParseInt(m[5], 10, 64)
			out = append(out, Part{Path: filepath.Join(table, dir, f.Name()), Day: day,
				Span: Span{Partition: int32(p), First: first, Last: last, MinSeq: change.LSN(minSeq), MaxSeq: change.LSN(maxSeq)}})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// Days lists the commit days (YYYY-MM-DD) table has files of, in order.
func (l *Lake) Days(table string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(l.dir, table))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if day, ok := strings.CutPrefix(e.Name(), "date="); ok && e.IsDir() {
			out = append(out, day)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Tables lists the lake's table directories (those holding events; the
// dead letters' and staging directories are not tables, while a table
// whose name starts with '_' is).
func (l *Lake) Tables() ([]string, error) {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && !Reserved(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Staged returns the smallest position each staged file holds: files of
// a batch being published (or whose publication a crash interrupted).
// A reader of the lake stops below them: their batch may be half
// published.
func (l *Lake) Staged() ([]change.LSN, error) {
	entries, err := os.ReadDir(filepath.Join(l.dir, stagingDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []change.LSN
	for _, e := range entries {
		rel, ok := strings.CutSuffix(e.Name(), ".staging")
		parts := strings.Split(rel, "~")
		if m := partName.FindStringSubmatch(parts[len(parts)-1]); ok && m != nil {
			minSeq, _ := strconv.ParseUint(m[1], 16, 64)
			out = append(out, change.LSN(minSeq))
		}
	}
	return out, nil
}

// HighOffsets returns, per Kafka partition, the highest offset a
// published file of table holds. A warehouse rebuilt from Kafka uses it to
// leave events already in the lake out of new lake files.
func (l *Lake) HighOffsets(table string) (map[int32]int64, error) {
	parts, err := l.Parts(table)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, p := range parts {
		if cur, ok := out[p.Span.Partition]; !ok || p.Span.Last > cur {
			out[p.Span.Partition] = p.Span.Last
		}
	}
	return out, nil
}

// Copy copies the file src to dst, created or truncated: a clone where
// the file system has reflinks (XFS, btrfs: the blocks are shared, O(1)
// in the file's size), else the kernel copies the bytes
// (copy_file_range). cloned says which. Sync makes the copy durable.
func Copy(src, dst string) (cloned bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return false, err
	}
	if clone(out, in) {
		return true, out.Close()
	}
	_, err = io.Copy(out, in)
	return false, errors.Join(err, out.Close())
}

// Sync makes a written file durable.
func Sync(path string) error { return syncPath(path) }

func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
