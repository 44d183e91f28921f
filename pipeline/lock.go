package pipeline

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/lakeflow/lakeflow/internal/fault"
)

// lockFile is the data directory's lock, held by the process that writes it.
const lockFile = "lakeflow.lock"

// lockDataDir makes sure one lakeflow at a time works in a data
// directory: two would fight over the slot, the broker and the warehouse.
func lockDataDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: create data_dir %s: %v", fault.ErrEnvironment, dir, err)
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %v", fault.ErrEnvironment, path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: another lakeflow is running on data_dir %s (lock %s held)", fault.ErrEnvironment, dir, path)
	}
	return func() { f.Close() }, nil
}

// dataDirLocked reports whether a lakeflow process holds the data
// directory's lock.
func dataDirLocked(dir string) bool {
	f, err := os.Open(filepath.Join(dir, lockFile))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}
