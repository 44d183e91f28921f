package pipeline

import (
	"context"
	"time"
)

// eachSecond calls look every second until ctx ends or look says to stop:
// the watchers of files a running pipeline takes (resync requests,
// contracts) look this often.
func eachSecond(ctx context.Context, look func() bool) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !look() {
			return
		}
	}
}
