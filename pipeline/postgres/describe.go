package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// Describe reads what a contract declares of each table from the live
// source: columns (without stored generated ones, which lakeflow does not
// capture) with their types as PostgreSQL spells them, nullability, and
// the primary key. A type that is not built in gets the built-in type it
// is stored as (an enum as text, a domain as its base type). Tables the
// source does not have are listed in gone.
func Describe(ctx context.Context, dsn string, tables []config.Table) (drafts []contracts.Draft, gone []config.Table, err error) {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close(context.Background())
	cat := newCatalog(conn)
	for _, t := range tables {
		rel, err := cat.relationByName(ctx, t.Schema, t.Name)
		if errors.Is(err, ErrGone) {
			gone = append(gone, t)
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", fault.ErrSource, err)
		}
		keys, err := cat.keyColumns(ctx, rel.oid)
		if err != nil {
			return nil, nil, err
		}
		d := contracts.Draft{Table: t}
		rows, err := conn.Query(ctx, `
			SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
			       CASE WHEN ty.typtype = 'e' THEN 'text'
			            WHEN ty.typtype = 'd' THEN format_type(ty.typbasetype, ty.typtypmod)
			            WHEN ty.typtype NOT IN ('b', 'r', 'm') THEN 'text' ELSE '' END
			FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid
			WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
			ORDER BY a.attnum`, rel.oid)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: describe %s: %v", fault.ErrUnavailable, t, err)
		}
		cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (contracts.Column, error) {
			var c contracts.Column
			err := r.Scan(&c.Name, &c.Type, &c.Nullable, &c.Base)
			return c, err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: describe %s: %v", fault.ErrUnavailable, t, err)
		}
		for i, c := range cols {
			if _, err := contracts.ParseType(c.Type, ""); err == nil {
				cols[i].Base = ""
			} else if c.Base == "" {
				cols[i].Base = "text" // a type of an extension: carried as its text
			}
			if keys[c.Name] {
				d.Key = append(d.Key, c.Name)
			}
		}
		d.Columns = cols
		drafts = append(drafts, d)
	}
	return drafts, gone, nil
}
