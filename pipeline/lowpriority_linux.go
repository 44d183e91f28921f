package pipeline

import (
	"runtime"
	"syscall"
)

// lowPriority runs f on an OS thread of its own at the lowest CPU
// priority (nice 19): the work a checkpoint's build does on its one
// DuckDB thread (which runs queries on the thread that calls them) then
// takes the CPU the batches leave. The thread ends with f, its priority
// with it.
func lowPriority(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // not unlocked: the thread exits with the goroutine
		syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19)
		f()
	}()
	<-done
}
