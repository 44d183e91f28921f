package lake

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/change"
)

// The lake keeps state checkpoints (warehouse.LoadCheckpoint) under
// checkpointDir, one DuckDB file each, named by its position: a
// checkpoint is built under a name of its own and renamed into place
// once whole and durable, so a reader lists only whole ones.
const checkpointDir = "_checkpoints"

// buildingPrefix names a checkpoint being built. Only one builder runs at
// a time (it holds the data directory's lock), so one left by a crash is
// removed when the next begins.
const buildingPrefix = ".building-"

// Checkpoint is a state checkpoint of the lake.
type Checkpoint struct {
	Seq  change.LSN
	Path string
}

// Checkpoints lists the lake's checkpoints, newest first.
func (l *Lake) Checkpoints() ([]Checkpoint, error) {
	entries, err := os.ReadDir(filepath.Join(l.dir, checkpointDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Checkpoint
	for _, e := range entries {
		hex, ok := strings.CutSuffix(e.Name(), ".duckdb")
		if !ok || len(hex) != 16 {
			continue
		}
		seq, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		out = append(out, Checkpoint{Seq: change.LSN(seq), Path: filepath.Join(l.dir, checkpointDir, e.Name())})
	}
	slices.SortFunc(out, func(a, b Checkpoint) int { return cmp.Compare(b.Seq, a.Seq) })
	return out, nil
}

// BuildCheckpoint gives the path to build a checkpoint at, the file and
// its DuckDB write-ahead log removed if a crash left them.
func (l *Lake) BuildCheckpoint() (string, error) {
	dir := filepath.Join(l.dir, checkpointDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), buildingPrefix) {
			// (DuckDB's spill directory among them.)
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return "", err
			}
		}
	}
	return filepath.Join(dir, buildingPrefix+"state.duckdb"), nil
}

// LastBuildBegun is when the newest checkpoint, or the newest build a
// kill or failure left unfinished, was begun or written (zero: none).
func (l *Lake) LastBuildBegun() time.Time {
	entries, err := os.ReadDir(filepath.Join(l.dir, checkpointDir))
	if err != nil {
		return time.Time{}
	}
	var last time.Time
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.ModTime().After(last) {
			last = fi.ModTime()
		}
	}
	return last
}

// PublishCheckpoint makes the checkpoint built at path durable under its
// position's name.
func (l *Lake) PublishCheckpoint(path string, seq change.LSN) (Checkpoint, error) {
	c := Checkpoint{Seq: seq, Path: filepath.Join(l.dir, checkpointDir, fmt.Sprintf("%016X.duckdb", uint64(seq)))}
	if err := l.sync(path); err != nil {
		return c, err
	}
	if err := os.Rename(path, c.Path); err != nil {
		return c, err
	}
	return c, l.sync(filepath.Dir(c.Path))
}

// RemoveCheckpoint removes a checkpoint. Call it holding the swap lock
// (LockSwaps): a reader holds the lake's files from its listing on.
func (l *Lake) RemoveCheckpoint(c Checkpoint) error {
	err := os.Remove(c.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// LastSeq is the largest position of the lake's files (0: none).
func (l *Lake) LastSeq() (change.LSN, error) {
	tables, err := l.Tables()
	if err != nil {
		return 0, err
	}
	var last change.LSN
	for _, t := range tables {
		parts, err := l.Parts(t)
		if err != nil {
			return 0, err
		}
		for _, p := range parts {
			last = max(last, p.Span.MaxSeq)
		}
	}
	return last, nil
}
