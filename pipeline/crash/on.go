//go:build faults

package crash

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// at is the point this process dies at, after times hits.
var at, times = func() (string, int64) {
	name, n, _ := strings.Cut(os.Getenv(Env), "@")
	times, err := strconv.ParseInt(n, 10, 64)
	if err != nil || times < 1 {
		times = 1
	}
	return name, times
}()

var hits atomic.Int64

// Point dies, as kill -9 does, the times-th time it is reached under the
// name LF_CRASH_AT gives, saying so on stderr first.
func Point(name string) {
	if name != at || hits.Add(1) != times {
		return
	}
	os.Stderr.WriteString("lakeflow: crash point " + name + "\n")
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
