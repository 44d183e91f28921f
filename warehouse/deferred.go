package warehouse

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// A transaction too large for one batch is applied in parts (a split
// mark): the part that holds an order may come before the part that holds
// its customer, though both are in one transaction, and an initial
// snapshot is one transaction. An existence rule is judged as a deferred
// foreign key is, when the transaction commits; so a change of the open
// transaction that fails one in a part is deferred, not quarantined: held
// back, and named in lakeflow.deferred, inside the part's transaction.
// The batch that ends the transaction reads them back from the lake (they
// are there, as every event is) and judges them for good with its own:
// once, whatever the number of parts. (A backfill of a warehouse that
// stopped between parts judges the part of the transaction the lake
// holds as a whole: it defers nothing.)
//
// A change that passes in a part is not judged again: one whose parent a
// later part of the same transaction deletes stays applied, where a batch
// holding the whole transaction would hold it back.

const deferredTable = `
CREATE TABLE IF NOT EXISTS lakeflow.deferred (
	source_table    VARCHAR NOT NULL,
	_cdc_seq        UBIGINT NOT NULL,
	_cdc_ord        UINTEGER NOT NULL,
	kafka_partition INTEGER NOT NULL,
	kafka_offset    BIGINT NOT NULL
);`

// deferredKey is the value that tells a deferred change apart in the
// lake: its position and its Kafka record (a snapshot's rows share one
// position; offsets repeat across Kafka eras).
const deferredKey = "{'s': CAST(_cdc_seq AS UBIGINT), 'o': CAST(_cdc_ord AS UINTEGER), 'p': CAST(kafka_partition AS INTEGER), 'k': CAST(kafka_offset AS BIGINT)}"

// deferOpen marks as deferred the changes of t at the open transaction's
// position (w.open) that failed one of its existence rules, with every
// failure they had: they are held back, and judged again later.
func (w *Warehouse) deferOpen(ctx context.Context, t *table) error {
	var names []string
	for _, r := range t.rules {
		if r.References != nil {
			names = append(names, literal(r.Name))
		}
	}
	if w.open == 0 || len(names) == 0 {
		return nil
	}
	_, err := w.conn.ExecContext(ctx, fmt.Sprintf(`UPDATE lakeflow_failures SET action = 'defer'
		FROM (SELECT DISTINCT f.kafka_partition, f.kafka_offset FROM lakeflow_failures f
			JOIN %s r ON r.kafka_partition = f.kafka_partition AND r.kafka_offset = f.kafka_offset
			WHERE f.tbl = %d AND f.rule IN (%s) AND r._cdc_seq = %d) d
		WHERE lakeflow_failures.tbl = %d AND lakeflow_failures.kafka_partition = d.kafka_partition AND lakeflow_failures.kafka_offset = d.kafka_offset`,
		rowsTable(t.id), t.id, strings.Join(names, ", "), uint64(w.open), t.id))
	return err
}

// recordDeferred names the changes of t deferOpen marked in
// lakeflow.deferred, and says how many there are.
func (w *Warehouse) recordDeferred(ctx context.Context, t *table) (int, error) {
	res, err := w.conn.ExecContext(ctx, fmt.Sprintf(`INSERT INTO lakeflow.deferred
		SELECT DISTINCT %s, r._cdc_seq, r._cdc_ord, r.kafka_partition, r.kafka_offset FROM lakeflow_failures f
		JOIN %s r ON r.kafka_partition = f.kafka_partition AND r.kafka_offset = f.kafka_offset
		WHERE f.tbl = %d AND f.action = 'defer'`, literal(t.schema.ID()), rowsTable(t.id), t.id))
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// redeem adds the deferred changes to the rows of the batch that ends
// their transaction, read back from the lake, and empties
// lakeflow.deferred: the batch judges them for good. It returns the
// batch's tables, with those that have only deferred changes.
func (w *Warehouse) redeem(ctx context.Context, order []*table, rows map[*table]rowsInfo) ([]*table, error) {
	type span struct {
		table    string
		min, max uint64
		count    int
	}
	var spans []span
	res, err := w.conn.QueryContext(ctx, "SELECT source_table, min(_cdc_seq), max(_cdc_seq), count(*) FROM lakeflow.deferred GROUP BY ALL")
	if err != nil {
		return nil, err
	}
	for res.Next() {
		var s span
		if err := res.Scan(&s.table, &s.min, &s.max, &s.count); err != nil {
			res.Close()
			return nil, err
		}
		spans = append(spans, s)
	}
	res.Close()
	if err := res.Err(); err != nil || len(spans) == 0 {
		return order, err
	}
	renames, err := w.renameChains(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range spans {
		t := w.tables[s.table]
		if t == nil {
			w.log.Warn("changes deferred for an existence rule belong to a table no longer captured: they stay in the lake alone", "table", s.table)
			continue
		}
		files, err := w.filesSpanning(ctx, s.table, s.min, s.max)
		if err != nil {
			return nil, err
		}
		if len(files) == 0 {
			w.log.Error("changes deferred for an existence rule are gone from the lake (its files were removed): they are lost", "table", s.table, "changes", s.count)
			continue
		}
		held, inBatch := rows[t]
		aside := "lakeflow_batch_" + rowsTable(t.id)
		if inBatch {
			if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("ALTER TABLE %s RENAME TO %s", rowsTable(t.id), aside)); err != nil {
				return nil, err
			}
		}
		where := fmt.Sprintf("%s IN (SELECT %s FROM lakeflow.deferred WHERE source_table = %s)", deferredKey, deferredKey, literal(s.table))
		// Offsets below zero, which no record of the batch has: the
		// rules tell changes apart by partition and offset.
		n, info, err := w.loadRows(ctx, t, files, renames[s.table], where, "-"+replayOffsets, false)
		if err != nil {
			return nil, fmt.Errorf("read the changes of %s deferred for an existence rule back from the lake: %w", s.table, err)
		}
		w.log.Debug("deferred changes judged again", "table", s.table, "changes", n)
		if n < s.count {
			// Not a stop: every later start would stop the same way.
			w.log.Error("changes deferred for an existence rule are gone from the lake (a file was removed): they are lost", "table", s.table, "changes", s.count-n)
		}
		if inBatch {
			for _, stmt := range []string{"INSERT INTO " + rowsTable(t.id) + " SELECT * FROM " + aside, "DROP TABLE " + aside} {
				if _, err := w.conn.ExecContext(ctx, stmt); err != nil {
					return nil, err
				}
			}
			info.keyOnly = info.keyOnly || held.keyOnly
			info.unchanged = info.unchanged || held.unchanged
			info.truncates = held.truncates
		} else {
			order = append(order, t)
		}
		rows[t] = info
	}
	slices.SortFunc(order, func(a, b *table) int { return a.id - b.id })
	_, err = w.conn.ExecContext(ctx, "DELETE FROM lakeflow.deferred")
	return order, err
}

// filesSpanning returns the lake files of a table whose events' positions
// meet [min, max].
func (w *Warehouse) filesSpanning(ctx context.Context, table string, min, max uint64) ([]string, error) {
	res, err := w.conn.QueryContext(ctx, "SELECT path FROM lakeflow.lake_files WHERE source_table = ? AND min_seq <= ? AND max_seq >= ? ORDER BY path",
		table, max, min)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	var files []string
	for res.Next() {
		var p string
		if err := res.Scan(&p); err != nil {
			return nil, err
		}
		// A file removed from the lake by hand cannot be read back.
		if abs := w.lake.Abs(p); fileExists(abs) {
			files = append(files, abs)
		}
	}
	return files, res.Err()
}

// OpenTransaction is the position of the transaction the last batch
// applied in part, 0 if it ended consistent: a restarted consumer goes
// on splitting it.
func (w *Warehouse) OpenTransaction() change.LSN { return w.open }

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
