package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
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

// rawColumn is a column as a Relation message gives it.
type rawColumn struct {
	Name   string
	OID    uint32
	TypMod int32
}

// attribute is what pg_attribute says of a column beyond its type.
type attribute struct {
	rawColumn
	dims      int
	generated bool
	// Rows that predate the column: PostgreSQL stores a constant DEFAULT
	// as their value ("fast default") in every storage relation (the
	// table, or each leaf partition) that existed then; missing lists
	// those values, nil where a relation has none, and missingIn the
	// relations. hasDefault and identity say whether anything else may
	// have filled them (a table rewrite).
	missing    []*string
	missingIn  []uint32
	hasDefault bool
	identity   bool
}

// relation is a table as the catalog describes it now, or, for a table
// dropped since the WAL described it, as lakeflow recorded it (past).
type relation struct {
	oid     uint32
	schema  string
	name    string
	attrs   []attribute
	storage []uint32
	leaves  []uint32 // the OIDs of storage's relations
	// past is the recorded schema of a table the catalog no longer has:
	// its key and its columns' types come from there.
	past *change.Table
}

// ErrGone marks a table or type the catalog no longer has: the WAL can
// still describe it as it was when the change was made.
var ErrGone = errors.New("does not exist in the source")

// pastRelation is a dropped table as lakeflow recorded it.
func pastRelation(oid uint32, recorded *change.Table) *relation {
	rel := &relation{oid: oid, schema: recorded.Schema, name: recorded.Name, storage: recorded.Storage, leaves: recorded.Leaves, past: recorded}
	for _, c := range recorded.Columns {
		rel.attrs = append(rel.attrs, attribute{rawColumn: rawColumn{Name: c.Name}, dims: c.Type.Dims})
	}
	return rel
}

// leavesSQL lists the relations that store the rows of table $1: the
// table itself, or the leaf partitions of a partitioned table.
const leavesSQL = `SELECT oid AS relid FROM pg_class WHERE oid = $1 AND relkind = 'r'
	UNION SELECT relid FROM pg_partition_tree($1) WHERE isleaf`

// relationByName reads schema.name.
func (c *catalog) relationByName(ctx context.Context, schema, name string) (*relation, error) {
	var oid uint32
	err := c.conn.QueryRow(ctx, `SELECT r.oid FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
		WHERE n.nspname = $1 AND r.relname = $2 AND r.relkind IN ('r', 'p')`, schema, name).Scan(&oid)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("table %s %w", change.QualifiedName(schema, name), ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("look up table %s: %w", change.QualifiedName(schema, name), err)
	}
	return c.relation(ctx, oid, schema, name)
}

// relation reads the columns of the table with the given oid.
func (c *catalog) relation(ctx context.Context, oid uint32, schema, name string) (*relation, error) {
	rows, err := c.conn.Query(ctx, `
		WITH leaves AS (`+leavesSQL+`)
		SELECT a.attname, a.atttypid, a.atttypmod, a.attndims, a.attgenerated <> '', a.attidentity <> '', a.atthasdef,
		       ARRAY(SELECT CASE WHEN l.atthasmissing THEN l.attmissingval::text END
		             FROM pg_attribute l JOIN leaves ON l.attrelid = leaves.relid
		             WHERE l.attname = a.attname AND NOT l.attisdropped ORDER BY l.attrelid),
		       ARRAY(SELECT l.attrelid::bigint
		             FROM pg_attribute l JOIN leaves ON l.attrelid = leaves.relid
		             WHERE l.attname = a.attname AND NOT l.attisdropped ORDER BY l.attrelid)
		FROM pg_attribute a
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", change.QualifiedName(schema, name), err)
	}
	attrs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (attribute, error) {
		var a attribute
		err := r.Scan(&a.Name, &a.OID, &a.TypMod, &a.dims, &a.generated, &a.identity, &a.hasDefault, &a.missing, &a.missingIn)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", change.QualifiedName(schema, name), err)
	}
	if len(attrs) == 0 {
		return nil, fmt.Errorf("table %s %w", change.QualifiedName(schema, name), ErrGone)
	}
	rel := &relation{oid: oid, schema: schema, name: name, attrs: attrs}
	err = c.conn.QueryRow(ctx, `SELECT coalesce(array_agg(c.relfilenode::bigint ORDER BY c.oid), '{}'), coalesce(array_agg(c.oid::bigint ORDER BY c.oid), '{}')
		FROM (`+leavesSQL+`) l JOIN pg_class c ON c.oid = l.relid`, oid).Scan(&rel.storage, &rel.leaves)
	if err != nil {
		return nil, fmt.Errorf("read storage of %s: %w", change.QualifiedName(schema, name), err)
	}
	return rel, nil
}

// partitionRoot returns the root of the partitioned table that the
// relation with the given oid is a partition of, or nil.
func (c *catalog) partitionRoot(ctx context.Context, oid uint32) (*config.Table, error) {
	var t config.Table
	err := c.conn.QueryRow(ctx, `SELECT n.nspname, r.relname FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
		WHERE r.oid = pg_partition_root($1) AND r.oid <> $1`, oid).Scan(&t.Schema, &t.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up the partition root of relation %d: %w", oid, err)
	}
	return &t, nil
}

// attribute returns the named attribute, or nil.
func (r *relation) attribute(name string) *attribute {
	for i := range r.attrs {
		if r.attrs[i].Name == name {
			return &r.attrs[i]
		}
	}
	return nil
}

// snapshotColumns are the columns the initial copy reads: pgoutput leaves
// stored generated columns out of the stream (PostgreSQL 15), so the copy
// leaves them out too and both agree on the table's shape.
func (r *relation) snapshotColumns() []rawColumn {
	var cols []rawColumn
	for _, a := range r.attrs {
		if !a.generated {
			cols = append(cols, a.rawColumn)
		}
	}
	return cols
}

// table builds the schema of a relation from the columns a Relation
// message (or the snapshot) names, marking the primary key (or replica
// identity index) columns as the key. A type dropped since the message
// was written is the type recorded (in recorded, the schema lakeflow
// holds) for a column of that name, else carried as text: a historic
// change decodes from what the WAL and lakeflow's own schema history
// say, never from today's catalog alone.
func (c *catalog) table(ctx context.Context, rel *relation, cols []rawColumn, recorded *change.Table) (*change.Table, error) {
	var keys map[string]bool
	if rel.past != nil {
		keys = map[string]bool{}
		for _, i := range rel.past.KeyColumns() {
			keys[rel.past.Columns[i].Name] = true
		}
	} else {
		var err error
		if keys, err = c.keyColumns(ctx, rel.oid); err != nil {
			return nil, err
		}
	}
	t := &change.Table{Schema: rel.schema, Name: rel.name, Storage: rel.storage, Leaves: rel.leaves}
	for _, rc := range cols {
		typ, err := c.resolve(ctx, rc.OID, rc.TypMod)
		if errors.Is(err, ErrGone) {
			typ, err = pastType(recorded, rc), nil
		}
		if err != nil {
			return nil, fmt.Errorf("table %s column %s: %w", t.ID(), rc.Name, err)
		}
		if typ.Dims > 0 {
			if a := rel.attribute(rc.Name); a != nil && a.dims > 1 {
				typ.Dims = a.dims
			}
		}
		t.Columns = append(t.Columns, change.Column{Name: rc.Name, Type: typ, Key: keys[rc.Name]})
	}
	if len(t.KeyColumns()) == 0 {
		return nil, fmt.Errorf("table %s has no primary key; add one (ALTER TABLE %s ADD PRIMARY KEY (…))", t.ID(), pgx.Identifier{t.Schema, t.Name}.Sanitize())
	}
	if err := t.CheckNames(); err != nil {
		return nil, err
	}
	return t, nil
}

// pastType is the type of a column whose type the catalog no longer has
// (an enum dropped with the column): the type recorded for the column,
// or else its text.
func pastType(recorded *change.Table, rc rawColumn) change.Type {
	if recorded != nil {
		if i := recorded.Column(rc.Name); i >= 0 {
			return recorded.Columns[i].Type
		}
	}
	return change.Type{Kind: change.KindOther, Name: fmt.Sprintf("a dropped type (oid %d)", rc.OID)}
}

// ErrUnknownValues marks a column added by a table rewrite: PostgreSQL
// filled the existing rows (a volatile DEFAULT, an identity) without
// sending a change for any of them.
var ErrUnknownValues = errors.New("values written by a table rewrite")

// fill says what rows that predate column name hold in it, for a column
// that prev (the recorded schema) lacks; from is the position from which
// events carry the column.
func (rel *relation) fill(prev *change.Table, c change.Column, from change.Position) (change.Fill, error) {
	name := c.Name
	a := rel.attribute(name)
	if a == nil {
		return change.Fill{}, nil // renamed or dropped again since; its next Relation says so
	}
	// The relations that held rows before the column was added have its
	// stored value; a partition created since has none (and no such rows).
	var value *string
	for i, m := range a.missing {
		if m == nil && len(prev.Leaves) > 0 && !slices.Contains(prev.Leaves, a.missingIn[i]) {
			continue
		}
		if m == nil || (value != nil && *m != *value) {
			value = nil
			break
		}
		value = m
	}
	if value != nil {
		text, null := missingValue(*value)
		if !null {
			if _, err := change.AppendValue(nil, c.Type, []byte(text)); err != nil {
				return change.Fill{}, fmt.Errorf("%w: column %s of %s was added with the default %q, which lakeflow cannot encode: %v",
					ErrUnknownValues, name, change.QualifiedName(rel.schema, rel.name), text, err)
			}
		}
		return change.Fill{Before: from, Null: null, Text: text}, nil
	}
	// No stored value: the rows hold NULL, unless PostgreSQL rewrote the
	// table to fill the column.
	if (a.hasDefault || a.identity) && rel.rewritten(prev) {
		what := "a DEFAULT PostgreSQL evaluates per row (random(), clock_timestamp(), a sequence…)"
		if a.identity {
			what = "an identity"
		}
		return change.Fill{}, fmt.Errorf("%w: column %s of %s was added with %s, so PostgreSQL rewrote the table and gave every existing row a value without sending any change",
			ErrUnknownValues, name, change.QualifiedName(rel.schema, rel.name), what)
	}
	return change.Fill{}, nil
}

// rewritten says whether a relation that held the table's rows when prev
// was recorded has new storage (PostgreSQL rewrote it). Partitions
// created or dropped since change the storage list, not a relation's.
func (rel *relation) rewritten(prev *change.Table) bool {
	if len(prev.Leaves) != len(prev.Storage) {
		// Recorded without the relations' OIDs: a file of prev's that is
		// gone was rewritten (or its partition dropped).
		return slices.ContainsFunc(prev.Storage, func(f uint32) bool { return !slices.Contains(rel.storage, f) })
	}
	for i, leaf := range prev.Leaves {
		if j := slices.Index(rel.leaves, leaf); j >= 0 && rel.storage[j] != prev.Storage[i] {
			return true
		}
	}
	return false
}

// missingValue reads the single element of attmissingval's text, an
// array literal such as {x}, {"a b"} or {NULL}.
func missingValue(lit string) (text string, null bool) {
	inner := strings.TrimSuffix(strings.TrimPrefix(lit, "{"), "}")
	if inner == "NULL" {
		return "", true
	}
	if len(inner) >= 2 && inner[0] == '"' {
		var b strings.Builder
		for i := 1; i < len(inner)-1; i++ {
			if inner[i] == '\\' && i+1 < len(inner)-1 {
				i++
			}
			b.WriteByte(inner[i])
		}
		return b.String(), false
	}
	return inner, false
}

func (c *catalog) keyColumns(ctx context.Context, oid uint32) (map[string]bool, error) {
	rows, err := c.conn.Query(ctx, `
		SELECT a.attname
		FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE i.indrelid = $1
		  AND i.indexrelid = COALESCE(
		        (SELECT indexrelid FROM pg_index WHERE indrelid = $1 AND indisprimary),
		        (SELECT indexrelid FROM pg_index WHERE indrelid = $1 AND indisreplident))`, oid)
	if err != nil {
		return nil, fmt.Errorf("read primary key of relation %d: %w", oid, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read primary key of relation %d: %w", oid, err)
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
// their element kind with one dimension (the column's declared dimensions
// come from pg_attribute), enums to text, and anything unknown to
// KindOther (carried as text).
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
	if errors.Is(err, pgx.ErrNoRows) {
		return change.Type{}, fmt.Errorf("type %d %w", oid, ErrGone)
	}
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
		t.Dims = 1
	case typtype == "e":
		t.Kind = change.KindText
	default:
		t.Kind = builtinKinds[typname]
		if t.Kind == "" {
			t.Kind = change.KindOther
		}
		switch {
		case t.Kind == change.KindNumeric && typmod >= 4:
			p, s := int((typmod-4)>>16)&0xffff, int(int16((typmod-4)&0xffff))
			if s >= 0 && s <= p && p <= 38 {
				t.Precision, t.Scale = p, s
			}
		case typname == "varchar" && typmod >= 4:
			t.Length = int(typmod - 4)
		case typname == "bpchar":
			t.Fixed = true
			if typmod >= 4 {
				t.Length = int(typmod - 4)
			}
		}
	}
	t.Name = name
	c.types[k] = t
	return t, nil
}
