package pipeline

import (
	"context"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// typedDDL is a table with one column of every type family lakeflow maps,
// including a TOASTed text, an enum and a domain.
const typedDDL = `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE typed (
	id    integer PRIMARY KEY,
	i2    smallint, i8 bigint, f4 real, f8 double precision,
	n     numeric(14,3), nu numeric, m money, b boolean,
	t     text, vc varchar(20), ch char(5), by bytea,
	d     date, tm time, ttz timetz, ts timestamp, tstz timestamptz, iv interval,
	u     uuid, j json, jb jsonb, ia integer[], ta text[],
	e     mood, dom posint, big text
);
ALTER TABLE typed REPLICA IDENTITY FULL;
CREATE TABLE scratch (id integer PRIMARY KEY, v text);
ALTER TABLE scratch REPLICA IDENTITY FULL;
`

// typedRow is an INSERT of row id with a mix of ordinary and edge values.
func typedRow(id string, variant int) string {
	rows := []string{
		`(%s, 1, 9223372036854775807, 1.5, 0.1, 12345678901.125, 123456789012345678901234567890.000000000000001, 1234.56, true,
		  'plain', 'varchar', 'ab', '\x00ff10', '2024-02-29', '13:45:01.5', '10:00:00+05:30', '2024-02-29 23:59:59.999999',
		  '2024-02-29 23:59:59.123456+00', '1 year 2 mons 3 days 04:05:06.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
		  '{"b": 1,  "a": [1, 2]}', '{"b": 1, "a": [1, 2]}', '{1,2,NULL}', '{"a b","c\"d",NULL,"NULL",","}', 'happy', 7, NULL)`,
		`(%s, -32768, -9223372036854775808, 'NaN', '-Infinity', -0.001, 'NaN', -92233720368547758.08, false,
		  E'tab\there "quotes" \\back\\slash\nnewline ünï©ødé 🚀', '', 'x', '\x', '0044-03-15 BC', '24:00:00', '23:59:59-11', '1900-01-01 00:00:00',
		  '1969-12-31 23:59:59.999999+00', '-1 years -2 mons +3 days -04:05:06', '00000000-0000-0000-0000-000000000000',
		  'null', '[]', '{}', '{}', 'sad', 1, NULL)`,
		`(%s, NULL, NULL, 'Infinity', 1e300, 0, 0, 0, NULL,
		  NULL, NULL, NULL, NULL, 'infinity', '00:00:00', '00:00:00+00', '-infinity',
		  'infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`,
	}
	return "INSERT INTO typed VALUES " + strings.Replace(rows[variant%len(rows)], "%s", id, 1)
}

// bigText is large and random enough to be stored out of line (TOAST).
const bigText = `(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g)`

// typedChanges exercises the change shapes: several updates of one row in
// one transaction, an update that leaves a TOASTed value unchanged, a
// primary-key update, deletes, re-inserts of deleted keys, and a TRUNCATE
// (of scratch, with changes before and after it in the same transaction),
// and a column added at the source.
func typedChanges(ctx context.Context, dsn string) error {
	steps := [][]string{
		{typedRow("10", 0), typedRow("11", 1), typedRow("12", 2), "UPDATE typed SET big = " + bigText + " WHERE id = 10"},
		{"UPDATE typed SET i2 = 2 WHERE id = 10", "UPDATE typed SET i2 = 3, t = 'second' WHERE id = 10", "UPDATE typed SET i2 = 4 WHERE id = 10"},
		{"UPDATE typed SET vc = 'toast stays' WHERE id = 10"}, // big is sent as unchanged TOAST
		{"UPDATE typed SET id = 110 WHERE id = 11"},
		{"DELETE FROM typed WHERE id = 12"},
		{typedRow("12", 0)},
		{"UPDATE typed SET iv = '24:00:00' WHERE id = 12", "UPDATE typed SET iv = '1 day' WHERE id = 110"},
		{"INSERT INTO scratch SELECT g, 'before' FROM generate_series(1, 50) g"},
		{"UPDATE scratch SET v = 'changed' WHERE id < 10", "TRUNCATE scratch", "INSERT INTO scratch VALUES (7, 'same txn')"},
		{"INSERT INTO scratch SELECT g, 'after' FROM generate_series(40, 60) g"},
		// An additive change: silver gains the column.
		{"ALTER TABLE scratch ADD COLUMN note varchar(10)", "UPDATE scratch SET note = 'n' || id WHERE id % 2 = 0", "INSERT INTO scratch VALUES (99, 'new', 'x')"},
		{typedRow("20", 2), typedRow("21", 0), "UPDATE typed SET big = " + bigText + " WHERE id = 21"},
		{"UPDATE typed SET n = n + 1, tstz = tstz + interval '1 second' WHERE id = 21"},
		{"DELETE FROM typed WHERE id = 20", typedRow("20", 1)},
	}
	return applySteps(ctx, dsn, steps)
}

func TestTypedRowsAreValid(t *testing.T) {
	dsn := pg.NewDatabase(t)
	pgtest.Exec(t, dsn, typedDDL)
	if err := typedChanges(context.Background(), dsn); err != nil {
		t.Fatal(err)
	}
}
