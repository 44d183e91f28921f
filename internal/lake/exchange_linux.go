package lake

import (
	"errors"

	"golang.org/x/sys/unix"
)

// exchange swaps two directories in one atomic rename (RENAME_EXCHANGE);
// a file system without it (or the kernel) gets the three renames of
// exchangeByRenames.
func exchange(a, b string) error {
	err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		return exchangeByRenames(a, b)
	}
	return err
}
