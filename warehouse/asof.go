package warehouse

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The warehouse lakeflow asof builds (OpenView + Replay with a bound)
// says which position it reflects, and is queried by the command.

// RecordAsOf writes lakeflow.asof: the position the warehouse reflects,
// as the user gave it, as the bound it resolved to (a _cdc_seq and its
// LSN), and the commit time asked for, if one was.
func (w *Warehouse) RecordAsOf(ctx context.Context, given string, b Bound, at time.Time) error {
	commit := "NULL"
	if !at.IsZero() {
		commit = fmt.Sprintf("make_timestamptz(%d)", at.UnixMicro())
	}
	return w.exec(ctx, []string{
		`CREATE OR REPLACE TABLE lakeflow.asof (position VARCHAR NOT NULL, _cdc_seq UBIGINT NOT NULL, lsn VARCHAR NOT NULL, commit_ts TIMESTAMPTZ,
			built_at TIMESTAMPTZ NOT NULL)`,
		fmt.Sprintf("INSERT INTO lakeflow.asof VALUES (%s, %d, %s, %s, now())", literal(given), uint64(b.Seq), literal(b.Seq.String()), commit),
	})
}

// DropState drops, from a warehouse built as of a position, the
// operations tables only a pipeline fills (where it stands in Kafka and
// the source, its batches, lake files and dead letters): what is left is
// silver, history, gold, the quarantine, the tables' schemas and marts,
// and lakeflow.asof.
func (w *Warehouse) DropState(ctx context.Context) error {
	var stmts []string
	for _, t := range []string{"offsets", "batches", "source_state", "lake_files", "dlq", "gold_pending"} {
		stmts = append(stmts, "DROP TABLE IF EXISTS lakeflow."+t)
	}
	return w.exec(ctx, stmts)
}

// SearchPath makes queries find tables of these schemas by name alone.
func (w *Warehouse) SearchPath(ctx context.Context, schemas ...string) error {
	_, err := w.conn.ExecContext(ctx, "SET search_path = "+literal(strings.Join(schemas, ",")))
	return err
}
