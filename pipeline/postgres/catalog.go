package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/pipeline/change"
)

// catalog resolves table schemas and column types from the source's
// system catalog. Types are cached by (oid, typmod).
type catalog struct {
	conn  *pgx.Conn
	types map[typeKey]change.Type
}

type typeKey struct {
	oid    uint32
	typmod int32
}

func newCatalog(conn *pgx.Conn) *catalog {
	return &catalog{conn: conn, types: map[typeKey]change.Type{}}
}

// rawColumn is a column as pg_attribute or a Relation message gives it.
type rawColumn struct {
	Name   string
	OID    uint32
	TypMod int32
}

// table builds the schema of schema.name from its columns, marking the
// primary key (or replica identity index) columns as the key.
func (c *catalog) table(ctx context.Context, schema, name string, cols []rawColumn) (*change.Table, error) {
	keys, err := c.keyColumns(ctx, schema, name)
	if err != nil {
		return nil, err
	}
	t := &change.Table{Schema: schema, Name: name}
	for _, rc := range cols {
		typ, err := c.resolve(ctx, rc.OID, rc.TypMod)
		if err != nil {
			return nil, fmt.Errorf("table %s.%s column %s: %w", schema, name, rc.Name, err)
		}
		t.Columns = append(t.Columns, change.Column{Name: rc.Name, Type: typ, Key: keys[rc.Name]})
	}
	if len(t.KeyColumns()) == 0 {
		return nil, fmt.Errorf("table %s.%s has no primary key; add one (ALTER TABLE %s.%s ADD PRIMARY KEY (…))", schema, name, schema, name)
	}
	return t, nil
}

// loadTable reads the current columns of schema.name.
func (c *catalog) loadTable(ctx context.Context, schema, name string) (*change.Table, error) {
	rows, err := c.conn.Query(ctx, `
		SELECT a.attname, a.atttypid, a.atttypmod
		FROM pg_attribute a
		JOIN pg_class r ON r.oid = a.attrelid
		JOIN pg_namespace n ON n.oid = r.relnamespace
		WHERE n.nspname = $1 AND r.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, schema, name)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, name, err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rawColumn, error) {
		var rc rawColumn
		err := r.Scan(&rc.Name, &rc.OID, &rc.TypMod)
		return rc, err
	})
	if err != nil {
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, name, err)
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("table %s.%s does not exist in the source", schema, name)
	}
	return c.table(ctx, schema, name, cols)
}

func (c *catalog) keyColumns(ctx context.Context, schema, name string) (map[string]bool, error) {
	rows, err := c.conn.Query(ctx, `
		SELECT a.attname
		FROM pg_index i
		JOIN pg_class r ON r.oid = i.indrelid
		JOIN pg_namespace n ON n.oid = r.relnamespace
		JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum = ANY (i.indkey)
		WHERE n.nspname = $1 AND r.relname = $2
		  AND i.indexrelid = COALESCE(
		        (SELECT indexrelid FROM pg_index WHERE indrelid = r.oid AND indisprimary),
		        (SELECT indexrelid FROM pg_index WHERE indrelid = r.oid AND indisreplident))`, schema, name)
	if err != nil {
		return nil, fmt.Errorf("read primary key of %s.%s: %w", schema, name, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read primary key of %s.%s: %w", schema, name, err)
	}
	keys := map[string]bool{}
	for _, n := range names {
		keys[n] = true
	}
	return keys, nil
}

// builtinKinds maps pg_type.typname of base types to their kind.
var builtinKinds = map[string]change.Kind{
	"int2": change.KindInt2, "int4": change.KindInt4, "int8": change.KindInt8,
	"float4": change.KindFloat4, "float8": change.KindFloat8,
	"numeric": change.KindNumeric, "money": change.KindMoney, "bool": change.KindBool,
	"text": change.KindText, "varchar": change.KindText, "bpchar": change.KindText,
	"name": change.KindText, "char": change.KindText, "citext": change.KindText,
	"bytea": change.KindBytea, "date": change.KindDate, "time": change.KindTime,
	"timetz": change.KindTimeTZ, "timestamp": change.KindTimestamp,
	"timestamptz": change.KindTimestampTZ, "interval": change.KindInterval,
	"uuid": change.KindUUID, "json": change.KindJSON, "jsonb": change.KindJSONB,
}

// resolve maps a type to its kind: domains to their base type, arrays to
// their element kind with Array set, enums to text, and anything unknown
// to KindOther (carried as text).
func (c *catalog) resolve(ctx context.Context, oid uint32, typmod int32) (change.Type, error) {
	k := typeKey{oid, typmod}
	if t, ok := c.types[k]; ok {
		return t, nil
	}
	var (
		name, typname     string
		typtype, category string
		elem, base        uint32
		baseTypmod        int32
	)
	err := c.conn.QueryRow(ctx, `
		SELECT format_type(t.oid, $2), t.typname, t.typtype::text, t.typcategory::text,
		       t.typelem, t.typbasetype, t.typtypmod
		FROM pg_type t WHERE t.oid = $1`, oid, typmod).
		Scan(&name, &typname, &typtype, &category, &elem, &base, &baseTypmod)
	if err != nil {
		return change.Type{}, fmt.Errorf("look up type %d: %w", oid, err)
	}
	var t change.Type
	switch {
	case typtype == "d":
		if t, err = c.resolve(ctx, base, baseTypmod); err != nil {
			return t, err
		}
	case category == "A" && elem != 0:
		if t, err = c.resolve(ctx, elem, typmod); err != nil {
			return t, err
		}
		t.Array = true
	case typtype == "e":
		t.Kind = change.KindText
	default:
		t.Kind = builtinKinds[typname]
		if t.Kind == "" {
			t.Kind = change.KindOther
		}
		if t.Kind == change.KindNumeric && typmod >= 4 {
			p, s := int((typmod-4)>>16)&0xffff, int(int16((typmod-4)&0xffff))
			if s >= 0 && s <= p && p <= 38 {
				t.Precision, t.Scale = p, s
			}
		}
	}
	t.Name = name
	c.types[k] = t
	return t, nil
}
