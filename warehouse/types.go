package warehouse

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// colType says how a source column lives in DuckDB: its silver type
// (change.Type.DuckDB), what to extract from the envelope's JSON (text, so
// a value that does not fit shows as a failed conversion instead of a
// silent NULL), the SQL that turns the extracted value into the lake's
// value (NULL when it cannot: the event goes to the dead-letter queue),
// and, where the lake cannot hold the silver type, the SQL from lake value
// to silver.
type colType struct {
	duck    string
	extract string
	conv    func(x string) string
	// toSilver is nil when the lake holds the silver type itself.
	toSilver func(x string) string
	// fits renders SQL that is true when extracted value x is NULL or
	// can be held: false sends the event to the dead-letter queue.
	fits func(x string) string
}

// silverValue renders the silver value of lake expression x.
func (ct colType) silverValue(x string) string {
	if ct.toSilver == nil {
		return x
	}
	return ct.toSilver(x)
}

// scalarFits is colType.fits for a value that is not a list.
func (ct colType) scalarFits(x string) string {
	return fmt.Sprintf("(%s IS NULL OR try(%s) IS NOT NULL)", x, ct.silverValue(ct.conv(x)))
}

func tryCast(t string) func(string) string {
	return func(x string) string { return "TRY_CAST(" + x + " AS " + t + ")" }
}

// duckType maps a source type. Values keep their meaning exactly:
// unconstrained numeric stays text (DECIMAL holds 38 digits), intervals
// keep months, days and microseconds apart.
func duckType(t change.Type) colType {
	ct := scalarType(t)
	// Each array dimension is one more level of list.
	for d := 0; d < t.Dims; d++ {
		inner := ct
		ct = colType{
			duck:    inner.duck + "[]",
			extract: inner.extract + "[]",
			conv:    func(x string) string { return "list_transform(" + x + ", e -> " + inner.conv("e") + ")" },
		}
		if inner.toSilver != nil {
			ct.toSilver = func(x string) string { return "list_transform(" + x + ", e -> " + inner.toSilver("e") + ")" }
		}
		// A NULL element is a value; a converted element that is NULL
		// is not.
		ct.fits = func(x string) string {
			return fmt.Sprintf("(%s IS NULL OR coalesce(list_bool_and(list_transform(%s, e -> %s)), true))", x, x, inner.fits("e"))
		}
	}
	return ct
}

func scalarType(t change.Type) colType {
	ct := scalarConv(t)
	ct.fits = ct.scalarFits
	return ct
}

func scalarConv(t change.Type) colType {
	t.Dims = 0
	duck := t.DuckDB()
	simple := colType{duck: duck, extract: "VARCHAR", conv: tryCast(duck)}
	switch t.Kind {
	case change.KindBytea:
		return colType{duck: duck, extract: "VARCHAR", conv: func(x string) string { return "try(from_base64(" + x + "))" }}
	case change.KindDate:
		return colType{duck: duck, extract: "VARCHAR", conv: func(x string) string {
			return withInfinities("DATE", "TRY_CAST("+x+" AS INTEGER)", change.DateInfinity, change.DateNegInfinity, "try(DATE '1970-01-01' + %s)")
		}}
	case change.KindTime:
		return colType{duck: duck, extract: "VARCHAR", conv: func(x string) string {
			return fmt.Sprintf("CASE TRY_CAST(%[1]s AS BIGINT) WHEN 86400000000 THEN TIME '24:00:00' ELSE try(TIME '00:00:00' + to_microseconds(TRY_CAST(%[1]s AS BIGINT))) END", x)
		}}
	case change.KindTimestamp:
		return colType{duck: duck, extract: "VARCHAR", conv: func(x string) string {
			return withInfinities("TIMESTAMP", "TRY_CAST("+x+" AS BIGINT)", change.TimestampInfinity, change.TimestampNegInfinity, "try(make_timestamp(%s))")
		}}
	case change.KindInterval:
		// Parquet cannot store negative intervals: the lake keeps
		// PostgreSQL's ISO 8601 text, silver the INTERVAL.
		return colType{duck: duck, extract: "VARCHAR", conv: func(x string) string { return x },
			toSilver: func(x string) string { return "lakeflow_iso_interval(" + x + ")" }}
	}
	return simple
}

// withInfinities maps Debezium's numbers for ±infinity back to DuckDB's
// infinities and every other number n through finite (a format with one
// %s for n).
func withInfinities(typ, n string, inf, negInf int64, finite string) string {
	return fmt.Sprintf("CASE %[1]s WHEN %[2]d THEN 'infinity'::%[4]s WHEN %[3]d THEN '-infinity'::%[4]s ELSE %[5]s END",
		n, inf, negInf, typ, fmt.Sprintf(finite, n))
}

// utcDateMacro is the UTC day of a TIMESTAMPTZ, as ts::DATE gives it in
// this session's zone (UTC), from the TIMESTAMP of the same instant: the
// cast goes through ICU's calendar, about 70 ns a value (1,000,000
// values: 74 ms, 5 ms this way), and the gold marts compute the day of
// every order to find the days a refresh recomputes.
const utcDateMacro = `CREATE OR REPLACE TEMP MACRO lakeflow_utc_date(ts) AS
	CASE WHEN isfinite(ts) THEN make_timestamp(epoch_us(ts))::DATE ELSE ts::DATE END`

// intervalMacro parses PostgreSQL's iso_8601 interval output
// (P1Y2M3DT4H5M6.5S, P-1Y-2M3DT-4H, PT0S), which DuckDB cannot cast,
// keeping months, days and microseconds apart as PostgreSQL does.
const intervalMacro = `CREATE OR REPLACE TEMP MACRO lakeflow_iso_interval(s) AS CASE WHEN s IS NULL THEN NULL ELSE (
	to_months(CAST(coalesce(nullif(regexp_extract(split_part(s, 'T', 1), '(-?\d+)Y', 1), ''), '0') AS INTEGER) * 12
	        + CAST(coalesce(nullif(regexp_extract(split_part(s, 'T', 1), '(-?\d+)M', 1), ''), '0') AS INTEGER))
	+ to_days(CAST(coalesce(nullif(regexp_extract(split_part(s, 'T', 1), '(-?\d+)D', 1), ''), '0') AS INTEGER))
	+ to_microseconds(
	    CAST(coalesce(nullif(regexp_extract(split_part(s, 'T', 2), '(-?\d+)H', 1), ''), '0') AS BIGINT) * 3600000000
	  + CAST(coalesce(nullif(regexp_extract(split_part(s, 'T', 2), '(-?\d+)M', 1), ''), '0') AS BIGINT) * 60000000
	  + CAST(round(CAST(coalesce(nullif(regexp_extract(split_part(s, 'T', 2), '(-?[0-9.]+)S', 1), ''), '0') AS DECIMAL(38,6)) * 1000000) AS BIGINT))
) END`

// ident quotes an SQL identifier.
func ident(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// literal quotes an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
