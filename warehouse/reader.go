package warehouse

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/lakeflow/lakeflow/internal/fault"
)

// Reader reads a published warehouse (warehouse.path), read-only, as any
// DuckDB client would: it never waits for, or slows, the pipeline.
type Reader struct {
	db   *sql.DB
	conn *sql.Conn
}

// OpenReader opens the published warehouse at path read-only, with its
// tables found by name alone (silver, gold, lakeflow).
func OpenReader(ctx context.Context, path string) (*Reader, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: no warehouse at %s (warehouse.path): lakeflow run creates it", fault.ErrConfig, path)
	}
	db, conn, err := connect(ctx, path, path+"?access_mode=READ_ONLY")
	if err != nil {
		return nil, err
	}
	r := &Reader{db: db, conn: conn}
	// (The pipeline's session too, so a mart's SQL runs here as it does
	// there: lakeflow_utc_date, UTC.)
	for _, stmt := range slices.Concat(session, []string{"SET search_path = 'silver,gold,lakeflow,main'"}) {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// Query runs a query and returns its result as text (or JSON rows).
func (r *Reader) Query(ctx context.Context, q string, asJSON bool) (Result, error) {
	return query(ctx, r.conn, q, asJSON)
}

// CSV writes a query's result to out as CSV with a header.
func (r *Reader) CSV(ctx context.Context, q string, out io.Writer) error {
	return writeCSV(ctx, r.conn, q, out)
}

// Close closes the reader.
func (r *Reader) Close() error { return errors.Join(r.conn.Close(), r.db.Close()) }

// QueryRow runs a query of one row into dst.
func (r *Reader) QueryRow(ctx context.Context, q string, dst ...any) error {
	return r.conn.QueryRowContext(ctx, q).Scan(dst...)
}
