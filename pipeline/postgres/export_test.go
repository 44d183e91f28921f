package postgres

import "time"

// SetSlotBusyTimeout shortens how long a slot held elsewhere is waited
// for; it returns the function that restores it.
func SetSlotBusyTimeout(d time.Duration) func() {
	old := slotBusyTimeout
	slotBusyTimeout = d
	return func() { slotBusyTimeout = old }
}
