package postgres

import (
	"context"
	"errors"
	"fmt"
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
		return nil, fmt.Errorf("%w: connect to source %s:%d/%s: %v", fault.ErrUnavailable, pc.Host, pc.Port, pc.Database, unwrapConnect(err))
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
		return nil, fmt.Errorf("%w: open replication connection to %s:%d/%s: %v", fault.ErrUnavailable, cfg.Host, cfg.Port, cfg.Database, unwrapConnect(err))
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
// per problem what to run to fix it.
func preflight(ctx context.Context, conn *pgx.Conn, tables []config.Table) error {
	var problems []string
	var version int
	var walLevel, encoding string
	var mayReplicate bool
	var role string
	err := conn.QueryRow(ctx, `
		SELECT current_setting('server_version_num')::int, current_setting('wal_level'),
		       current_setting('server_encoding'), current_user,
		       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)`).
		Scan(&version, &walLevel, &encoding, &role, &mayReplicate)
	if err != nil {
		return fmt.Errorf("%w: inspect source: %v", fault.ErrUnavailable, err)
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
		var identity string
		var hasKey bool
		err := conn.QueryRow(ctx, `
			SELECT r.relreplident::text,
			       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = r.oid AND (i.indisprimary OR i.indisreplident))
			FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
			WHERE n.nspname = $1 AND r.relname = $2 AND r.relkind IN ('r', 'p')`, t.Schema, t.Name).
			Scan(&identity, &hasKey)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			problems = append(problems, fmt.Sprintf("table %s does not exist in the source (check source.tables, or run `lakeflow run --demo` for the demo schema)", t))
			continue
		case err != nil:
			return fmt.Errorf("%w: inspect table %s: %v", fault.ErrUnavailable, t, err)
		}
		if !hasKey {
			problems = append(problems, fmt.Sprintf("table %s has no primary key: add one (ALTER TABLE %s ADD PRIMARY KEY (…))", t, t))
		}
		if identity != "f" {
			problems = append(problems, fmt.Sprintf("table %s does not log full rows: run ALTER TABLE %s REPLICA IDENTITY FULL", t, t))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", fault.ErrSource, strings.Join(problems, "; "))
	}
	return nil
}

// ensurePublication makes the publication list exactly the captured
// tables. Tables can be added only before the slot exists: PostgreSQL 15
// cannot export a snapshot for an existing slot, so a later addition would
// have no initial copy.
func ensurePublication(ctx context.Context, conn *pgx.Conn, name string, tables []config.Table, slotExists bool) error {
	rows, err := conn.Query(ctx, `SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1`, name)
	if err != nil {
		return fmt.Errorf("%w: read publication %s: %v", fault.ErrUnavailable, name, err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("%w: read publication %s: %v", fault.ErrUnavailable, name, err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("%w: read publication %s: %v", fault.ErrUnavailable, name, err)
	}
	want := map[string]bool{}
	var idents []string
	for _, t := range tables {
		want[t.String()] = true
		idents = append(idents, pgx.Identifier{t.Schema, t.Name}.Sanitize())
	}
	pub := pgx.Identifier{name}.Sanitize()
	if !exists {
		create := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", pub, strings.Join(idents, ", "))
		if _, err := conn.Exec(ctx, create); err != nil {
			return fmt.Errorf("%w: create publication %s: %v; run %s as the tables' owner", fault.ErrSource, name, err, create)
		}
		return nil
	}
	haveSet := map[string]bool{}
	for _, h := range have {
		haveSet[h] = true
		if !want[h] {
			if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s", pub, identFor(h))); err != nil {
				return fmt.Errorf("%w: drop %s from publication %s: %v", fault.ErrSource, h, name, err)
			}
		}
	}
	for i, t := range tables {
		if haveSet[t.String()] {
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

func identFor(qualified string) string {
	schema, name, _ := strings.Cut(qualified, ".")
	return pgx.Identifier{schema, name}.Sanitize()
}

// DatabaseName returns the database a DSN connects to.
func DatabaseName(dsn string) (string, error) {
	cfg, err := parseConfig(dsn, false)
	if err != nil {
		return "", err
	}
	return cfg.Database, nil
}
