// Package fault holds the error classes that decide how lakeflow exits.
// Stages mark an error with fmt.Errorf("%w: …", fault.ErrX, …); only
// main.go maps classes to exit codes.
package fault

import (
	"errors"
	"fmt"
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
	// ErrQuery: a query the user gave (lakeflow sql, asof --query, --where)
	// or a position or table it asks about is wrong; the configuration
	// and the pipeline are fine.
	ErrQuery = errors.New("query")
)

// OneLine folds a message onto one line (DuckDB's span several), as the
// command line prints errors.
func OneLine(msg string) string { return strings.Join(strings.Fields(msg), " ") }

// Plain is a DuckDB error's message without the excerpt of the statement
// DuckDB appends ("LINE 1: …"), on one line: lakeflow wraps what the
// user wrote (a rule's check, a query) in SQL of its own, which the
// excerpt shows instead of theirs.
func Plain(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\nLINE ")
	return OneLine(msg)
}

// DiskFull says whether err is a write that found its disk full: the
// system's error, or DuckDB's words for it.
func DiskFull(err error) bool {
	if errors.Is(err, syscall.ENOSPC) {
		return true
	}
	return err != nil && (strings.Contains(err.Error(), "No space left on device") || strings.Contains(err.Error(), "out of disk space"))
}

// DidYouMean suggests the known word nearest to word, as " (did you mean
// X?)", when a typo explains the difference (at most a third of its
// letters, and two, edited; case aside); "" otherwise.
func DidYouMean(word string, known []string) string {
	best, bestDist := "", min(2, max(1, len([]rune(word))/3))+1
	for _, k := range known {
		if d := distance(strings.ToLower(word), strings.ToLower(k)); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best == "" || strings.EqualFold(best, word) {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

// distance is the edit distance between a and b: the fewest letters
// inserted, deleted, replaced or swapped with the next that turn one into
// the other (optimal string alignment).
func distance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}
