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

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
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
// per problem what to run to fix it. Every replica identity that names
// the row is accepted: FULL logs the whole old row, DEFAULT (PostgreSQL's
// own) the old key, and the stream needs no more (see Decoder: a delete
// needs only the key, and the warehouse takes a large value an update
// left unchanged from the version before). NOTHING, and an identity
// index other than the key silver is merged on, are refused. A captured
// table dropped from the source (recorded says lakeflow captured it) is
// only warned about, and returned in gone: its changes still in the WAL
// are applied, and silver, history and lake keep it.
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
		var hasKey bool
		var nothing, otherIndex []string
		// Each leaf (a partition logs its own rows, and PostgreSQL does
		// not pass the setting down) with identity NOTHING, or USING
		// INDEX of an index that is not the primary key.
		err := conn.QueryRow(ctx, `
			WITH r AS (SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			           WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')),
			     leaves AS (SELECT l.oid, l.relname, l.relnamespace, l.relreplident FROM pg_class l, r
			                WHERE l.oid IN (SELECT r.oid WHERE r.relkind = 'r' UNION SELECT relid FROM pg_partition_tree(r.oid) WHERE isleaf))
			SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = r.oid AND (i.indisprimary OR i.indisreplident)),
			       ARRAY(SELECT format('%I.%I', ln.nspname, l.relname) FROM leaves l JOIN pg_namespace ln ON ln.oid = l.relnamespace
			             WHERE l.relreplident = 'n' ORDER BY 1),
			       ARRAY(SELECT format('%I.%I', ln.nspname, l.relname) FROM leaves l JOIN pg_namespace ln ON ln.oid = l.relnamespace
			             WHERE l.relreplident = 'i' AND EXISTS (SELECT 1 FROM pg_index p WHERE p.indrelid = l.oid AND p.indisprimary AND NOT p.indisreplident)
			             ORDER BY 1)
			FROM r`, t.Schema, t.Name).
			Scan(&hasKey, &nothing, &otherIndex)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && recorded(t.String()):
			log.Warn("a captured table no longer exists in the source: its changes still in the WAL are applied, and silver, history and lake keep it; take it out of source.tables",
				"table", t.String())
			gone = append(gone, t)
			continue
		case errors.Is(err, pgx.ErrNoRows):
			problems = append(problems, fmt.Sprintf("table %s does not exist in the source%s (check source.tables, or run `lakeflow run --demo` for the demo schema)", t, tableMeant(ctx, conn, t)))
			continue
		case err != nil:
			return nil, fmt.Errorf("%w: inspect table %s: %v", fault.ErrUnavailable, t, err)
		}
		ident := pgx.Identifier{t.Schema, t.Name}.Sanitize()
		if !hasKey {
			problems = append(problems, fmt.Sprintf("table %s has no primary key: add one (ALTER TABLE %s ADD PRIMARY KEY (…))", t, ident))
		}
		if len(nothing) > 0 {
			problems = append(problems, fmt.Sprintf("table %s has REPLICA IDENTITY NOTHING, so its updates and deletes do not say which row they change: run %s",
				t, identityCommands(nothing)))
		}
		if len(otherIndex) > 0 {
			problems = append(problems, fmt.Sprintf("table %s has a REPLICA IDENTITY USING INDEX other than its primary key, which silver merges on: run %s",
				t, identityCommands(otherIndex)))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", fault.ErrSource, strings.Join(problems, "; "))
	}
	return gone, nil
}

// identityCommands is the fix for relations whose replica identity lakeflow
// cannot use: PostgreSQL's default, the primary key.
func identityCommands(rels []string) string {
	cmds := make([]string, len(rels))
	for i, rel := range rels {
		cmds[i] = "ALTER TABLE " + rel + " REPLICA IDENTITY DEFAULT;"
	}
	return strings.Join(cmds, " ")
}

// ensurePublication makes the publication list exactly the captured
// tables, publishing partitioned tables under their root's name (so rows
// of every partition, attached now or later, are events of the root).
// A table added once the slot streams is copied while it streams
// (runCopies): its changes are published from here on.
func ensurePublication(ctx context.Context, conn *pgx.Conn, name string, tables []config.Table) error {
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

// tableMeant suggests the source's table a typo in t's name explains
// (" (did you mean …?)"), or "".
func tableMeant(ctx context.Context, conn *pgx.Conn, t config.Table) string {
	rows, err := conn.Query(ctx, `SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1`)
	if err != nil {
		return ""
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return ""
	}
	return fault.DidYouMean(t.String(), names)
}
