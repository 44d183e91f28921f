// Package fault holds the error classes that decide how lakeflow exits.
// Stages mark an error with fmt.Errorf("%w: …", fault.ErrX, …); only
// main.go maps classes to exit codes.
package fault

import (
	"errors"
	"strings"
	"syscall"
)

var (
	// ErrConfig: the configuration or the command line is wrong.
	ErrConfig = errors.New("configuration")
	// ErrEnvironment: the machine lacks something lakeflow needs (server
	// binaries, a reachable directory, a free port).
	ErrEnvironment = errors.New("environment")
	// ErrUnavailable: a service (PostgreSQL, Kafka) could not be reached
	// or refused the work.
	ErrUnavailable = errors.New("unavailable")
	// ErrSource: the source database is not set up for lakeflow (wal_level,
	// replication privilege, primary keys, REPLICA IDENTITY FULL).
	ErrSource = errors.New("source not ready")
	// ErrSchemaBreak: a source schema change lakeflow cannot apply; ingestion
	// stopped before writing anything wrong.
	ErrSchemaBreak = errors.New("breaking schema change")
	// ErrCheckFailed: a contract rule whose action is fail, or a check the
	// user asked for, failed.
	ErrCheckFailed = errors.New("check failed")
)

// OneLine folds a message onto one line (DuckDB's span several), as the
// command line prints errors.
func OneLine(msg string) string { return strings.Join(strings.Fields(msg), " ") }

// DiskFull says whether err is a write that found its disk full: the
// system's error, or DuckDB's words for it.
func DiskFull(err error) bool {
	if errors.Is(err, syscall.ENOSPC) {
		return true
	}
	return err != nil && (strings.Contains(err.Error(), "No space left on device") || strings.Contains(err.Error(), "out of disk space"))
}
