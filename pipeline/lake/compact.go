package lake

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// A compaction builds a table's commit day again, its small files merged,
// in a directory of its own under compactDir, then exchanges that
// directory with the day's in one atomic rename: a reader listing the
// lake sees the day's old files or its new ones, never both, never
// neither. The old ones are left where the new were built, for readers
// that opened them before, until a grace period has passed.
const compactDir = "_compact"

// CompactDir is the directory a compaction with id builds its day in
// (and, once swapped, keeps the old files in).
func (l *Lake) CompactDir(id string) string { return filepath.Join(l.dir, compactDir, id) }

// CompactIDs lists the compactions whose directories exist.
func (l *Lake) CompactIDs() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(l.dir, compactDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids, nil
}

// DayDir is the directory of table's commit day (YYYY-MM-DD).
func (l *Lake) DayDir(table, day string) string { return filepath.Join(l.dir, table, "date="+day) }

// Exchange swaps the day directory of table with the directory compaction
// id built, atomically, and makes both renames durable.
func (l *Lake) Exchange(table, day, id string) error {
	day, built := l.DayDir(table, day), l.CompactDir(id)
	if err := exchange(built, day); err != nil {
		return fmt.Errorf("exchange %s with the compacted %s: %w", day, built, err)
	}
	return errors.Join(l.sync(filepath.Dir(day)), l.sync(filepath.Dir(built)))
}

// exchangeByRenames swaps directories a and b by way of a third name (a
// crash between the renames leaves b's old content there, and a reader
// may find b missing meanwhile: only where the system cannot exchange).
func exchangeByRenames(a, b string) error {
	tmp := a + ".exchanging"
	if err := os.Rename(b, tmp); err != nil {
		return err
	}
	if err := os.Rename(a, b); err != nil {
		return errors.Join(err, os.Rename(tmp, b))
	}
	return os.Rename(tmp, a)
}

// SyncDir makes a directory's entries durable.
func (l *Lake) SyncDir(dir string) error { return l.sync(dir) }
