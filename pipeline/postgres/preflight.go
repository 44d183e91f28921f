package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lakeflow/lakeflow/pipeline/config"
	"github.com/lakeflow/lakeflow/pipeline/fault"
)

// sessionParams make every value's text output predictable: pgoutput and
// COPY both print with these settings, and the envelope relies on them.
var sessionParams = map[string]string{
	"DateStyle":          "ISO, YMD",
	"TimeZone":           "UTC",
	"IntervalStyle":      "iso_8601",
	"bytea_output":       "hex",
	"lc_monetary":        "C",
	"extra_float_digits": "1",
	"application_name":   "lakeflow",
}

// parseConfig parses dsn with lakeflow's session settings; replication
// connections ask for a logical walsender.
func parseConfig(dsn string, replication bool) (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		// pgconn's ParseConfigError masks the password.
		return nil, fmt.Errorf("%w: source.dsn: %v", fault.ErrConfig, err)
	}
	for k, v := range sessionParams {
		cfg.RuntimeParams[k] = v
	}
	if replication {
		cfg.RuntimeParams["replication"] = "database"
	}
	return cfg, nil
}

func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	pc, err := parseConfig(dsn, false)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.Config = *pc
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: connect to source %s:%d/%s: %w", fault.ErrUnavailable, pc.Host, pc.Port, pc.Database, unwrapConnect(err))
	}
	return conn, nil
}

func connectReplication(ctx context.Context, dsn string) (*pgconn.PgConn, error) {
	cfg, err := parseConfig(dsn, true)
	if err != nil {
		return nil, err
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: open replication connection to %s:%d/%s: %w", fault.ErrUnavailable, cfg.Host, cfg.Port, cfg.Database, unwrapConnect(err))
	}
	return conn, nil
}

// unwrapConnect drops pgx's "failed to connect to host=… user=…" preamble
// down to the server's or the network's own words.
func unwrapConnect(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr
	}
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// preflight checks that the source can be captured, and says in one line
// per problem what to run to fix it. Partitions of a partitioned table
// that do not log full rows are only warned about: the stream takes their
// changes without the old row (see Decoder; the warehouse fills the
// values an update left unchanged), and partitions are often attached
// later by tools that do not set it. A captured table dropped
// from the source (recorded says lakeflow captured it) is only warned
// about too, and returned in gone: its changes still in the WAL are
// applied, and silver, history and lake keep it.
func preflight(ctx context.Context, conn *pgx.Conn, tables []config.Table, recorded func(id string) bool, log *slog.Logger) (gone []config.Table, err error) {
	var problems []string
	var version int
	var walLevel, encoding string
	var mayReplicate bool
	var role string
	err = conn.QueryRow(ctx, `
		SELECT current_setting('server_version_num')::int, current_setting('wal_level'),
		       current_setting('server_encoding'), current_user,
		       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)`).
		Scan(&version, &walLevel, &encoding, &role, &mayReplicate)
	if err != nil {
		return nil, fmt.Errorf("%w: inspect source: %v", fault.ErrUnavailable, err)
	}
	if version < 140000 {
		problems = append(problems, fmt.Sprintf("PostgreSQL %d.%d is too old: lakeflow needs 14 or newer", version/10000, version%10000/100))
	}
	if walLevel != "logical" {
		problems = append(problems, fmt.Sprintf("wal_level is %s: run ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL", walLevel))
	}
	if encoding != "UTF8" {
		problems = append(problems, fmt.Sprintf("server encoding is %s: lakeflow needs a UTF8 database", encoding))
	}
	if !mayReplicate {
		problems = append(problems, fmt.Sprintf("role %s may not replicate: run ALTER ROLE %s REPLICATION", role, pgx.Identifier{role}.Sanitize()))
	}
	for _, t := range tables {
		var hasKey, partitioned bool
		var notFull []string
		err := conn.QueryRow(ctx, `
			SELECT r.relkind = 'p', EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = r.oid AND (i.indisprimary OR i.indisreplident)),
			       ARRAY(SELECT format('%I.%I', ln.nspname, l.relname)
			             FROM pg_class l JOIN pg_namespace ln ON ln.oid = l.relnamespace
			             WHERE l.oid IN (SELECT r.oid WHERE r.relkind = 'r' UNION SELECT relid FROM pg_partition_tree(r.oid) WHERE isleaf)
			               AND l.relreplident <> 'f' ORDER BY l.relname)
			FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
			WHERE n.nspname = $1 AND r.relname = $2 AND r.relkind IN ('r', 'p')`, t.Schema, t.Name).
			Scan(&partitioned, &hasKey, &notFull)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && recorded(t.String()):
			log.Warn("a captured table no longer exists in the source: its changes still in the WAL are applied, and silver, history and lake keep it; take it out of source.tables",
				"table", t.String())
			gone = append(gone, t)
			continue
		case errors.Is(err, pgx.ErrNoRows):
			problems = append(problems, fmt.Sprintf("table %s does not exist in the source (check source.tables, or run `lakeflow run --demo` for the demo schema)", t))
			continue
		case err != nil:
			return nil, fmt.Errorf("%w: inspect table %s: %v", fault.ErrUnavailable, t, err)
		}
		ident := pgx.Identifier{t.Schema, t.Name}.Sanitize()
		if !hasKey {
			problems = append(problems, fmt.Sprintf("table %s has no primary key: add one (ALTER TABLE %s ADD PRIMARY KEY (…))", t, ident))
		}
		if len(notFull) > 0 {
			// A partitioned table's partitions log their own rows: each
			// needs the setting (PostgreSQL does not pass it down).
			var cmds []string
			for _, rel := range notFull {
				cmds = append(cmds, "ALTER TABLE "+rel+" REPLICA IDENTITY FULL;")
			}
			if partitioned {
				log.Warn("partitions do not log full rows: their updates come without the old row, and a large value an update leaves unchanged is taken from silver's version of the row",
					"table", t.String(), "run", strings.Join(cmds, " "))
			} else {
				problems = append(problems, fmt.Sprintf("table %s does not log full rows: run %s", t, strings.Join(cmds, " ")))
			}
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", fault.ErrSource, strings.Join(problems, "; "))
	}
	return gone, nil
}

// ensurePublication makes the publication list exactly the captured
// tables, publishing partitioned tables under their root's name (so rows
// of every partition, attached now or later, are events of the root).
// Tables can be added only before the slot exists: PostgreSQL 15 cannot
// export a snapshot for an existing slot, so a later addition would have
// no initial copy.
func ensurePublication(ctx context.Context, conn *pgx.Conn, name string, tables []config.Table, slotExists bool) error {
	var exists, viaRoot bool
	err := conn.QueryRow(ctx, `SELECT true, pubviaroot FROM pg_publication WHERE pubname = $1`, name).Scan(&exists, &viaRoot)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: read publication %s: %v", fault.ErrUnavailable, name, err)
	}
	pub := pgx.Identifier{name}.Sanitize()
	idents := make([]string, len(tables))
	for i, t := range tables {
		idents[i] = pgx.Identifier{t.Schema, t.Name}.Sanitize()
	}
	if !exists {
		create := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish_via_partition_root = true)", pub, strings.Join(idents, ", "))
		if _, err := conn.Exec(ctx, create); err != nil {
			return fmt.Errorf("%w: create publication %s: %v; run %s as the tables' owner", fault.ErrSource, name, err, create)
		}
		return nil
	}
	if !viaRoot {
		alter := fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pub)
		if _, err := conn.Exec(ctx, alter); err != nil {
			return fmt.Errorf("%w: %v; run %s as its owner", fault.ErrSource, err, alter)
		}
	}
	rows, err := conn.Query(ctx, `
		SELECT n.nspname, c.relname FROM pg_publication_rel pr
		JOIN pg_publication p ON p.oid = pr.prpubid
		JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE p.pubname = $1`, name)
	if err != nil {
		return fmt.Errorf("%w: read publication %s: %v", fault.ErrUnavailable, name, err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowToStructByPos[config.Table])
	if err != nil {
		return fmt.Errorf("%w: read publication %s: %v", fault.ErrUnavailable, name, err)
	}
	for _, h := range have {
		if !slices.Contains(tables, h) {
			if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s", pub, pgx.Identifier{h.Schema, h.Name}.Sanitize())); err != nil {
				return fmt.Errorf("%w: drop %s from publication %s: %v", fault.ErrSource, h, name, err)
			}
		}
	}
	for i, t := range tables {
		if slices.Contains(have, t) {
			continue
		}
		if slotExists {
			return fmt.Errorf("%w: table %s was added to source.tables after the initial snapshot; lakeflow cannot copy it into a running slot (PostgreSQL exports snapshots only for new slots): remove it from source.tables, or start over with a new source.slot",
				fault.ErrConfig, t)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pub, idents[i])); err != nil {
			return fmt.Errorf("%w: add %s to publication %s: %v", fault.ErrSource, t, name, err)
		}
	}
	return nil
}

// DatabaseName returns the database a DSN connects to.
func DatabaseName(dsn string) (string, error) {
	cfg, err := parseConfig(dsn, false)
	if err != nil {
		return "", err
	}
	return cfg.Database, nil
}
