package lake

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// A reader that lists the lake and then reads the files it listed
// (lakeflow asof and check) holds the swap lock shared from its listing
// to its end; a compaction exchanges a day only under the lock held
// exclusively. So a listing never names files a swap moved away in the
// meantime, however long the reader takes. (DuckDB over lake/ takes no
// lock: it lists the old day or the new one, and a query that was
// listing at the moment of a swap may find a file gone and must be run
// again.)
const swapLockFile = "_compact.lock"

// HoldFiles takes the swap lock shared, waiting for a swap under way.
func (l *Lake) HoldFiles() (release func(), err error) {
	f, err := l.swapLock()
	if errors.Is(err, os.ErrNotExist) {
		return func() {}, nil // a lake no one could compact
	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// ErrReadersHold is the error of a swap that would have to wait for
// readers of the lake.
var ErrReadersHold = errors.New("readers of the lake hold its files")

// LockSwaps takes the swap lock exclusively; without wait it does not
// wait for readers (ErrReadersHold).
func (l *Lake) LockSwaps(wait bool) (unlock func(), err error) {
	f, err := l.swapLock()
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX
	if !wait {
		how |= syscall.LOCK_NB
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrReadersHold
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}

// swapLock opens the lock's file, read-only where the lake is (a reader's
// copy of it, say).
func (l *Lake) swapLock() (*os.File, error) {
	path := filepath.Join(l.dir, swapLockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return os.Open(path)
	}
	return f, nil
}
