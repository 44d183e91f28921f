package warehouse

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/build"
	"github.com/lakeflow/lakeflow/internal/change"
)

// A state checkpoint is what a replay of the lake held at a position S
// (silver, history and the quarantine; a replay defers nothing, and gold
// is computed from silver), kept as a DuckDB file in the lake
// (lake.Checkpoints). A replay that starts from it loads that state and
// reads only the events after S: it holds what a replay from the lake's
// start holds, as a replay in chunks holds at each chunk's end what one
// chunk would. So lakeflow asof and check cost the state and the events
// since the checkpoint, not the lake's whole history.
//
// The checkpoint is that replay's only if its inputs are the same: the
// contracts (their rules and history) and each table's schema versions.
// Its manifest records their digests; a replay whose own differ does
// not start from it.

// checkpointFormat changes when what a checkpoint holds, or what a
// replay makes of the same events, does: older checkpoints no longer fit.
const checkpointFormat = 1

// checkpointSchema is the name a replay attaches a checkpoint under.
const checkpointSchema = "lakeflow_checkpoint"

// CheckpointInputs are the digests of what a replay's state depends on
// besides the lake's events.
type CheckpointInputs struct {
	// Build is the lakeflow that replays: a fix of a transform makes the
	// checkpoints of the builds before it unfit.
	Build     string `json:"build"`
	Contracts string `json:"contracts"`
	// Tables are each table's schema versions, by source ID.
	Tables map[string]string `json:"tables"`
}

// InputsOf gives the digests of a replay under set of the lake's schema
// versions (LakeState.Schemas).
func InputsOf(set contracts.Set, schemas []Schema) CheckpointInputs {
	in := CheckpointInputs{Build: build.Identity(), Tables: map[string]string{}}
	// What of a contract a replay reads: its rules (a column's nullable
	// among them), key, renames and history; not its owner or words.
	type judged struct {
		Table   string
		History bool
		Key     []string
		Columns []contracts.Column
		Rules   []contracts.Rule
	}
	var all []judged
	for _, name := range slices.Sorted(maps.Keys(set)) {
		c := set[name]
		j := judged{Table: name, History: c.History, Key: c.Key, Columns: slices.Clone(c.Columns), Rules: slices.Clone(c.Rules)}
		for i := range j.Columns {
			j.Columns[i].Description = ""
		}
		for i := range j.Rules {
			j.Rules[i].Description = ""
		}
		all = append(all, j)
	}
	in.Contracts = digest(all)
	versions := map[string][]Schema{}
	for _, s := range schemas {
		versions[s.Table.ID()] = append(versions[s.Table.ID()], s)
	}
	for id, vs := range versions {
		in.Tables[id] = digest(vs)
	}
	return in
}

func digest(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("checkpoint digest: %v", err)) // plain data: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// WriteCheckpointManifest records, in this warehouse built as of a
// position by a replay under in, what it is a checkpoint of.
func (w *Warehouse) WriteCheckpointManifest(ctx context.Context, at Bound, in CheckpointInputs) error {
	tables, err := json.Marshal(in.Tables)
	if err != nil {
		return err
	}
	return w.exec(ctx, []string{
		"CREATE OR REPLACE TABLE lakeflow.checkpoint (format INTEGER NOT NULL, _cdc_seq UBIGINT NOT NULL, build VARCHAR NOT NULL, contracts VARCHAR NOT NULL, tables JSON NOT NULL)",
		fmt.Sprintf("INSERT INTO lakeflow.checkpoint VALUES (%d, %d, %s, %s, %s)", checkpointFormat, uint64(at.Seq), literal(in.Build), literal(in.Contracts), literal(string(tables))),
	})
}

// LoadCheckpoint loads, into this view that holds no state yet, the
// state of the checkpoint at path of the tables it replays, if the
// checkpoint fits a replay under in up to upto: it is one of a replay
// under the same inputs, at a position at or before upto, and a table it
// does not hold has no event at or before its position (one captured
// since). It returns the checkpoint's position, and why it did not fit
// (nothing loaded) if it did not.
func (w *Warehouse) LoadCheckpoint(ctx context.Context, path string, in CheckpointInputs, upto change.LSN) (at change.LSN, unfit string, err error) {
	if _, err := w.conn.ExecContext(ctx, fmt.Sprintf("ATTACH %s AS %s (READ_ONLY)", literal(path), checkpointSchema)); err != nil {
		return 0, "", err
	}
	defer w.conn.ExecContext(context.WithoutCancel(ctx), "DETACH "+checkpointSchema)
	var format int
	err = w.conn.QueryRowContext(ctx, "SELECT format FROM "+checkpointSchema+".lakeflow.checkpoint").Scan(&format)
	if err != nil {
		return 0, "", err
	}
	if format != checkpointFormat {
		return 0, fmt.Sprintf("a lakeflow of another checkpoint format (%d, this one reads %d) wrote it", format, checkpointFormat), nil
	}
	var seq uint64
	var buildID, contractsDigest, tablesJSON string
	err = w.conn.QueryRowContext(ctx, "SELECT _cdc_seq, build, contracts, tables::VARCHAR FROM "+checkpointSchema+".lakeflow.checkpoint").
		Scan(&seq, &buildID, &contractsDigest, &tablesJSON)
	if err != nil {
		return 0, "", err
	}
	at = change.LSN(seq)
	var held map[string]string
	if err := json.Unmarshal([]byte(tablesJSON), &held); err != nil {
		return 0, "", fmt.Errorf("its manifest: %w", err)
	}
	switch {
	case at > upto:
		return at, "it is after the position", nil
	case buildID != in.Build:
		return at, "another lakeflow build (" + buildID + ") wrote it", nil
	case contractsDigest != in.Contracts:
		return at, "the contracts changed since it was written", nil
	}
	for _, t := range w.tables {
		id := t.schema.ID()
		if d, ok := held[id]; ok {
			if d != in.Tables[id] {
				return at, "the schema of " + id + " changed since it was written", nil
			}
			continue
		}
		parts, err := w.parts(lakeDir(t.schema))
		if err != nil {
			return 0, "", err
		}
		for _, p := range parts {
			if p.Span.MinSeq <= at {
				return at, id + " has events it does not hold", nil
			}
		}
	}
	var stmts []string
	var ids []string
	for _, t := range w.tables {
		if _, ok := held[t.schema.ID()]; !ok {
			continue
		}
		ids = append(ids, literal(t.schema.ID()))
		names := []string{t.schema.Name}
		if t.history {
			names = append(names, t.schema.Name+"_history")
		}
		for _, name := range names {
			// The same columns of the same types, or a row loaded would
			// lack a value a replay gives it (a column added with a
			// default that no lake file's schema carries yet, say).
			same, err := w.sameColumns(ctx, name)
			if err != nil {
				return 0, "", err
			}
			if !same {
				return at, "silver." + name + " has other columns than it holds", nil
			}
			target := "silver." + ident(name)
			stmts = append(stmts, fmt.Sprintf("INSERT INTO %s BY NAME SELECT * FROM %s.%s", target, checkpointSchema, target))
		}
	}
	if len(ids) > 0 {
		stmts = append(stmts, fmt.Sprintf("INSERT INTO lakeflow.quarantine BY NAME SELECT * FROM %s.lakeflow.quarantine WHERE source_table IN (%s)",
			checkpointSchema, strings.Join(ids, ", ")))
	}
	if err := w.inTx(ctx, func(ctx context.Context) error { return w.exec(ctx, stmts) }); err != nil {
		return 0, "", fmt.Errorf("load it: %w", err)
	}
	return at, "", nil
}

// sameColumns says whether silver's table name has the columns, of the
// same types, in this warehouse and in the checkpoint attached.
func (w *Warehouse) sameColumns(ctx context.Context, name string) (bool, error) {
	var differ int
	err := w.conn.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) FROM (
		(SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'silver' AND table_name = %[1]s
		EXCEPT SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = %[2]s AND schema_name = 'silver' AND table_name = %[1]s)
		UNION ALL
		(SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = %[2]s AND schema_name = 'silver' AND table_name = %[1]s
		EXCEPT SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'silver' AND table_name = %[1]s))`,
		literal(name), literal(checkpointSchema))).Scan(&differ)
	return differ == 0, err
}
