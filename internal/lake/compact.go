package lake

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// A compaction builds a table's commit day again, its small files merged,
// in a directory of its own under compactDir (<id>/day: one level deeper
// than a table's days, so a glob of the lake's tables, lake/*/*/*.parquet,
// never counts old files), then exchanges that directory with the day's
// in one atomic rename: a reader listing the lake sees the day's old
// files or its new ones, never both, never neither. The old ones are left
// where the new were built, for readers that opened them before, until a
// grace period has passed.
const compactDir = "_compact"

// BatchesFile is the file, beside a day's merged files, that lists every
// consistent batch of the files they replaced (Parquet: batch, seq,
// commit_ts). Its name keeps it out of globs of *.parquet and out of
// Hive-style readers, which skip names starting with '_'.
const BatchesFile = "_batches"

// CompactDir is the directory a compaction with id builds its day in
// (and, once swapped, keeps the old files in).
func (l *Lake) CompactDir(id string) string { return filepath.Join(l.dir, compactDir, id, "day") }

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

// RemoveCompaction removes what compaction id left under compactDir.
func (l *Lake) RemoveCompaction(id string) error {
	return os.RemoveAll(filepath.Dir(l.CompactDir(id)))
}

// DayDir is the directory of table's commit day (YYYY-MM-DD).
func (l *Lake) DayDir(table, day string) string { return filepath.Join(l.dir, table, "date="+day) }

// Exchange swaps the day directory of table with the directory compaction
// id built, atomically, and makes both renames durable. A day directory
// that is gone (removed by hand since the compaction was recorded) holds
// nothing to keep: the built one takes its place, or every start would
// stop at the exchange.
func (l *Lake) Exchange(table, day, id string) error {
	day, built := l.DayDir(table, day), l.CompactDir(id)
	if _, err := os.Stat(day); errors.Is(err, os.ErrNotExist) {
		if err := os.Rename(built, day); err != nil {
			return fmt.Errorf("move the compacted %s to %s: %w", built, day, err)
		}
		return errors.Join(l.sync(filepath.Dir(day)), l.sync(filepath.Dir(built)))
	}
	if err := exchange(built, day); err != nil {
		return fmt.Errorf("exchange %s with the compacted %s: %w", day, built, err)
	}
	return errors.Join(l.sync(filepath.Dir(day)), l.sync(filepath.Dir(built)))
}

// exchanging ends the name exchangeByRenames parks a directory under.
const exchanging = ".exchanging"

// exchangeByRenames swaps directories a and b by way of a third name, a
// reader finding b missing meanwhile: only where the system cannot
// exchange. A crash between the renames is finished by FinishExchange.
func exchangeByRenames(a, b string) error {
	tmp := a + exchanging
	if err := os.Rename(b, tmp); err != nil {
		return err
	}
	if err := os.Rename(a, b); err != nil {
		return errors.Join(err, os.Rename(tmp, b))
	}
	return os.Rename(tmp, a)
}

// FinishExchange finishes an exchange by renames of compaction id's day
// that a crash interrupted, if there is one.
func (l *Lake) FinishExchange(table, day, id string) error {
	day, built := l.DayDir(table, day), l.CompactDir(id)
	tmp := built + exchanging
	if _, err := os.Stat(tmp); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if _, err := os.Stat(day); errors.Is(err, os.ErrNotExist) {
		if err := os.Rename(built, day); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, built); err != nil {
		return err
	}
	return errors.Join(l.sync(filepath.Dir(day)), l.sync(filepath.Dir(built)))
}

// SyncBuilt makes a day built for compaction id durable: its files'
// entries, and its own up to the lake's root.
func (l *Lake) SyncBuilt(id string) error {
	built := l.CompactDir(id)
	return errors.Join(l.sync(built), l.sync(filepath.Dir(built)), l.sync(filepath.Dir(filepath.Dir(built))), l.sync(l.dir))
}
