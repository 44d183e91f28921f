//go:build faults

package crash

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Hold is how long a process holds at the point HoldEnv names.
const Hold = 3 * time.Second

// at is the point this process dies at, after times hits; held, the
// point it holds at.
var at, held = point(Env), point(HoldEnv)

// A point, from an environment variable: point or point@n.
type spot struct {
	name  string
	times int64
	hits  atomic.Int64
}

func point(env string) *spot {
	name, n, _ := strings.Cut(os.Getenv(env), "@")
	times, err := strconv.ParseInt(n, 10, 64)
	if err != nil || times < 1 {
		times = 1
	}
	return &spot{name: name, times: times}
}

// reached says whether this is the times-th time s's point is reached.
func (s *spot) reached(name string) bool { return name == s.name && s.hits.Add(1) == s.times }

// Point dies, as kill -9 does, the times-th time it is reached under the
// name LF_CRASH_AT gives, saying so on stderr first; or holds there for
// Hold, under the name LF_HOLD_AT gives.
func Point(name string) {
	if held.reached(name) {
		os.Stderr.WriteString("lakeflow: holding at " + name + "\n")
		time.Sleep(Hold)
	}
	if !at.reached(name) {
		return
	}
	os.Stderr.WriteString("lakeflow: crash point " + name + "\n")
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
