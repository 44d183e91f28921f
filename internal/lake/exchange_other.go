//go:build !linux

package lake

// exchange swaps two directories by three renames where the system has no
// atomic exchange: a reader may find the day missing between two of them.
func exchange(a, b string) error { return exchangeByRenames(a, b) }
