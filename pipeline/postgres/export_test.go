package postgres

import "time"

// SetSlotBusyTimeout shortens how long a slot held elsewhere is waited
// for; it returns the function that restores it.
func SetSlotBusyTimeout(d time.Duration) func() {
	old := slotBusyTimeout
	slotBusyTimeout = d
	return func() { slotBusyTimeout = old }
}

// OnChunkRead runs f between each chunk's read and its high watermark (an
// error it returns is the read's); it returns the function that removes
// it.
func OnChunkRead(f func(table string) error) func() {
	chunkRead = f
	return func() { chunkRead = nil }
}
