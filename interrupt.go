package main

import (
	"context"
	"log/slog"
)

// onInterrupt watches for the first Ctrl-C (or SIGTERM), which cancels
// ctx: it says what the run does now, and gives the signals back their
// default, so that a second one ends the process at once. That is as safe
// as kill -9: the next run goes on from the last commit. stop is the
// signal.NotifyContext's; the returned function ends the watch (once its
// message, if any, is out) and must run before stop does.
func onInterrupt(ctx context.Context, stop func(), log *slog.Logger) func() {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case <-done:
		case <-ctx.Done():
			stop()
			log.Info("interrupted: stopping once the work in progress is committed; interrupt again to stop at once (nothing is lost: the next run goes on from the last commit)")
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
