//go:build !linux

package pipeline

// lowPriority runs f (at the usual priority where threads have none of
// their own).
func lowPriority(f func()) { f() }
