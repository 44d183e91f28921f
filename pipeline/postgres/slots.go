package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// InactiveSlot is a logical replication slot of the database that no one
// reads: it holds the WAL from RestartLSN on, which PostgreSQL cannot
// remove, however long it lies there.
type InactiveSlot struct {
	Name          string `json:"name"`
	Plugin        string `json:"plugin"`
	RetainedBytes int64  `json:"retained_bytes"`
	// Lost says PostgreSQL invalidated it (max_slot_wal_keep_size).
	Lost bool `json:"lost,omitempty"`
}

// Drop is the statement that drops the slot.
func (s InactiveSlot) Drop() string {
	return fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", s.Name)
}

// InactiveSlots lists the source database's logical slots that no one
// reads, but except (the pipeline's own, which waits for the next run).
func InactiveSlots(ctx context.Context, dsn, except string) ([]InactiveSlot, error) {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT slot_name, plugin, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, 0),
			coalesce(wal_status = 'lost', false)
		FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() AND NOT active AND slot_name <> $1
		ORDER BY slot_name`, except)
	if err != nil {
		return nil, fmt.Errorf("read replication slots: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[InactiveSlot])
}

// dropReplacedSlot drops the slot a pipeline used before a new
// source.slot replaced it, if no one reads it: it would hold WAL for ever.
func (s *Source) dropReplacedSlot(ctx context.Context, conn *pgx.Conn, old string) {
	if old == "" || old == s.cfg.Slot {
		return
	}
	var dropped bool
	err := conn.QueryRow(ctx, `SELECT count(pg_drop_replication_slot(slot_name)) > 0 FROM pg_replication_slots
		WHERE slot_name = $1 AND database = current_database() AND NOT active`, old).Scan(&dropped)
	switch {
	case err != nil:
		s.log.Warn("the replication slot source.slot replaced was not dropped: it holds WAL until it is", "slot", old, "err", err,
			"run", InactiveSlot{Name: old}.Drop())
	case dropped:
		s.log.Info("the replication slot source.slot replaced is dropped", "slot", old)
	}
}
