package warehouse

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
)

const typedTopic = "lf.public.typed"

// typed has a column of every kind a flat decoder carries.
var typed = &change.Table{Schema: "public", Name: "typed", Columns: []change.Column{
	{Name: "id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}, Key: true},
	{Name: "small", Type: change.Type{Kind: change.KindInt2, Name: "smallint"}},
	{Name: "int", Type: change.Type{Kind: change.KindInt4, Name: "integer"}},
	{Name: "flag", Type: change.Type{Kind: change.KindBool, Name: "boolean"}},
	{Name: `odd "name"`, Type: change.Type{Kind: change.KindText, Name: "text"}},
	{Name: "addr", Type: change.Type{Kind: change.KindOther, Name: "inet"}},
	{Name: "num", Type: change.Type{Kind: change.KindNumeric, Name: "numeric"}},
	{Name: "at", Type: change.Type{Kind: change.KindTimestampTZ, Name: "timestamp with time zone"}},
	{Name: "raw", Type: change.Type{Kind: change.KindBytea, Name: "bytea"}},
	{Name: "price", Type: change.Type{Kind: change.KindNumeric, Name: "numeric(12,2)", Precision: 12, Scale: 2}},
	{Name: "cash", Type: change.Type{Kind: change.KindMoney, Name: "money"}},
	{Name: "day", Type: change.Type{Kind: change.KindDate, Name: "date"}},
	{Name: "stamp", Type: change.Type{Kind: change.KindTimestamp, Name: "timestamp without time zone"}},
	{Name: "clock", Type: change.Type{Kind: change.KindTime, Name: "time without time zone"}},
	{Name: "uid", Type: change.Type{Kind: change.KindUUID, Name: "uuid"}},
	{Name: "f4", Type: change.Type{Kind: change.KindFloat4, Name: "real"}},
	{Name: "f8", Type: change.Type{Kind: change.KindFloat8, Name: "double precision"}},
	{Name: "span", Type: change.Type{Kind: change.KindInterval, Name: "interval"}},
}}

// typedValues are PostgreSQL texts per column of typed: three that any
// row may hold, then edges that a row holds now and then.
var typedValues = [][]string{
	{"0", "1", "-9223372036854775808", "9223372036854775807", "42"},
	{"0", "-32768", "32767", "7"},
	{"0", "-2147483648", "2147483647", "-1"},
	{"t", "f", "t"},
	{"", "plain", `quote " and \ backslash`, "line\nbreak\ttab\rreturn", "\x01ctl\x1f\x7f", "ünïcødé 😀", "null", " padded "},
	{"192.168.0.1/24", "::1", "10.0.0.0/8"},
	{"NaN", "123.4500", "-0.1", "0.00001", "99999999999999999999999999999999999999999"},
	{"2024-02-29 23:59:59.123456+00", "0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00", "infinity", "-infinity",
		"1000-01-01 00:00:00+00 BC", "294276-12-31 23:59:59+00", "1970-01-01 00:00:00+00", "2024-01-01 12:00:00.5+00"},
	{`\x`, `\x00ff10`, `\xdeadbeef`},
	{"0.00", "-9999999999.99", "9999999999.99", "12.50", "NaN"},
	{"$0.00", "-$92,233,720,368,547,758.08", "$92,233,720,368,547,758.07", "$1,234.50"},
	{"2024-02-29", "0001-01-01", "9999-12-31", "1970-01-01", "infinity", "-infinity", "0044-03-15 BC", "5874897-12-31"},
	{"2024-02-29 23:59:59.123456", "0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "infinity", "-infinity", "1000-01-01 00:00:00 BC", "1969-12-31 23:59:59.999999"},
	{"00:00:00", "23:59:59.999999", "12:30:00.5", "24:00:00"},
	{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"},
	{"0", "1.5", "0.1", "-2.25", "3.4028235e+38", "1.1754944e-38", "1e-45", "NaN", "Infinity", "-Infinity", "-0", "1e+20", "123456.79", "16777217"},
	{"0", "3.141592653589793", "0.1", "1.7976931348623157e+308", "2.2250738585072014e-308", "5e-324", "-0", "NaN", "Infinity", "1e+100", "-1.2345678901234567e-100"},
	{"PT0S", "P1Y2M3DT4H5M6.5S", "P-1Y-2M3DT-4H-5M-6.5S", "P178956970Y7M", "P-178956970Y-8M", "PT-0.000001S", "P1D", "PT1H",
		"PT2562047788H", "P2147483647D", "PT0.5S", "P-2147483648D", "PT2147483647H59M59.999999S"},
}

// typedEnvelopes are envelopes of typed as the producer writes them,
// every op, NULLs and key-only deletes among them.
func typedEnvelopes(rng *rand.Rand, n int) [][]byte {
	env := change.Envelope{Name: "lf", Database: "db"}
	var out [][]byte
	for i := range n {
		row := make([]change.Datum, len(typed.Columns))
		for c, vals := range typedValues {
			v := vals[rng.IntN(3)]
			if rng.IntN(6) == 0 {
				v = vals[rng.IntN(len(vals))]
			}
			if i < len(vals) {
				v = vals[i]
			}
			row[c] = change.Datum{Text: []byte(v), Null: c > 0 && rng.IntN(8) == 0}
		}
		ops := []change.Op{change.OpCreate, change.OpUpdate, change.OpDelete, change.OpRead, change.OpTruncate}
		ev := change.Event{Table: typed, Op: ops[rng.IntN(len(ops))], Pos: change.Position{Seq: change.LSN(1000 + i), Ord: uint32(i % 3)},
			LSN: change.LSN(1000 + i), TxID: uint32(i % 4), Commit: 1709251199000000 + int64(i)*7919, Snapshot: change.SnapshotNone}
		switch ev.Op {
		case change.OpDelete:
			ev.Before = row
			if ev.KeyOnly = rng.IntN(3) == 0; ev.KeyOnly {
				for c := 1; c < len(row); c++ {
					row[c] = change.Datum{Null: true}
				}
			}
		case change.OpUpdate:
			ev.Before, ev.After = row, row
		case change.OpTruncate:
		default:
			ev.After = row
		}
		v, err := env.AppendValue(nil, &ev, 1709251199000+int64(i))
		if err != nil {
			panic(err)
		}
		out = append(out, v)
	}
	return out
}

// respellings are values to put in place of a field's in a mutated
// envelope (the field's first occurrence): other spellings of its value,
// values out of its type's range, the wrong JSON type.
var respellings = map[string][]string{
	"id":               {"null", "-0", "9223372036854775808", "1.0", "01"},
	"small":            {"1.0e0", "-0", "32768", "-32769", `"5"`, "01"},
	"int":              {"2147483648", `"5"`, "1e3", "-2147483649"},
	"flag":             {`"true"`, "1", "null", "True"},
	`odd \"name\"`:     {`"pl\/ain"`, `"pl\u0061in"`, `"plain\u0000"`, "5", `"\ud83d\ude00"`, `"\u001f\u007f"`, `"a\bb"`},
	"num":              {"1.5", `"1.5"`, "-0"},
	"at":               {`"2024-02-30T00:00:00Z"`, `"2024-01-01T00:00:00+00:00"`, `"2024-01-01T00:00:00.1234567Z"`, `"2024-01-01 00:00:00Z"`, "1", `"1582-10-10T00:00:00Z"`},
	"raw":              {`"AB="`, `"@@"`, `"AB=="`, `"QUJD"`, `""`, `"QUI"`},
	"price":            {`"1.234"`, `"12345678901.5"`, `"-0"`, `"1e2"`, `"01.5"`, "1.5", `".5"`, `"5."`, `"+1"`, `" 1"`},
	"cash":             {`"92233720368547758.08"`, `"-1.5"`, `"1,5"`},
	"day":              {"2932897", "-719163", "-2147472692", `"1"`, "0", "-0"},
	"stamp":            {"253402300800000000", "-62135596800000001", "9223372036825200000", "-0"},
	"clock":            {"86400000000", "-1", "86399999999", "0"},
	"f4":               {"72057598332895233", "9007199791611905", "1.50", "1E2", "-0.0", "1e40", "01.5", ".5", "0.30000000000000004", "1.0000000000000000001", "3.4028236e+38", "1e-40", "16777217"},
	"f8":               {"1.50", "1E2", "-0.0", "1e400", "00", "1e-310", "0.1000000000000000055511151231257827", "9007199254740993", "-1e308"},
	"span":             {`"P2M1Y"`, `"PT1.1234567S"`, `"1 day"`, `"P1W"`, `"PT1.S"`, `"PT"`, `"P"`, `"P-T1S"`, `"p1d"`, `"P1DT"`, `"PT.5S"`, `"P1Y2M3D4H"`, `"P999999999999Y"`, `"PT-1H-2M-3.25S"`, `"P178956971Y"`, `"PT2562047789H"`, `"P2147483648D"`},
	"uid":              {`"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"`, `"a0eebc999c0b4ef8bb6d6bb9bd380a11"`, `"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"`},
	"op":               {`"x"`, "null", `"C"`},
	"_cdc_seq":         {"-1", `"5"`, "18446744073709551616", "1.5"},
	"_cdc_ord":         {"4294967296", "-0"},
	"_commit_ts":       {`"x"`, `"2024-02-30T00:00:00Z"`, "null"},
	"txId":             {"-1", `"1"`, "18446744073709551615"},
	"lsn":              {`"1"`, "null", "0"},
	"_before_key_only": {`"yes"`, "1", "null", "false"},
	"before":           {"{}", "null", `{"id":1}`},
	"after":            {"{}", "null"},
}

// field matches a field and its scalar value.
func field(name string) *regexp.Regexp {
	return regexp.MustCompile(`"` + regexp.QuoteMeta(name) + `":(null|true|false|-?[0-9.eE+]+|"(?:[^"\\]|\\.)*")`)
}

// mutate spoils or respells an envelope: some of its variants mean the
// same to from_json, others are dead letters.
func mutate(rng *rand.Rand, v []byte) []byte {
	v = bytes.Clone(v)
	names := slices.Sorted(maps.Keys(respellings))
	switch k := rng.IntN(10); {
	case k < 7:
		name := names[rng.IntN(len(names))]
		vals := respellings[name]
		re := field(name)
		if name == "before" || name == "after" {
			re = regexp.MustCompile(`"` + name + `":(null|\{[^{}]*\})`)
		}
		loc := re.FindIndex(v)
		if loc == nil {
			return v
		}
		return slices.Concat(v[:loc[0]], []byte(`"`+name+`":`+vals[rng.IntN(len(vals))]), v[loc[1]:])
	case k == 7:
		// A field twice, whitespace, an unknown field.
		extra := []string{`,"op":"d"}`, `,"_cdc_seq":1}`, ` }`, `,"extra":1}`, `,"ts_ms":{}}`, `,"before":null}`, `,"after":null}`,
			`,"_before_key_only":false}`, `,"_commit_ts":"2024-01-01T00:00:00Z"}`, `,"source":{}}`}
		if rng.IntN(3) == 0 { // in source
			extra = []string{`"lsn":1,`, `"txId":2,`, `"xmin":{},`, `"other":1,`}
			return bytes.Replace(v, []byte(`"source":{`), []byte(`"source":{`+extra[rng.IntN(len(extra))]), 1)
		}
		return append(v[:len(v)-1], extra[rng.IntN(len(extra))]...)
	case k == 8:
		return v[:rng.IntN(len(v))]
	default:
		at := rng.IntN(len(v))
		return append(v[:at], append([]byte{`{}[]":,-0123456789.e\ntu`[rng.IntN(24)]}, v[at+1:]...)...)
	}
}

// TestFlatDecoderAgreesWithParseSQL: the rows a batch decodes are the same
// whether parseSQL decodes every envelope or a flat decoder those it
// takes: values, types, dead letters and their reasons. Envelopes as the
// producer writes them, with every edge value a carrier has, and spoiled
// or respelled ones mixed in.
func TestFlatDecoderAgreesWithParseSQL(t *testing.T) {
	f, tb := typedFixture(t)
	defer f.close()
	rng := rand.New(rand.NewPCG(11, 12))
	var recs []Record
	for i, v := range typedEnvelopes(rng, 3000) {
		if i%2 == 1 {
			v = mutate(rng, v)
		}
		recs = append(recs, Record{Topic: typedTopic, Offset: int64(i), Value: v})
	}
	n := decodersAgree(t, f, tb, recs)
	if n.flat < len(recs)/3 || n.sql < len(recs)/4 {
		t.Fatalf("the flat decoder took %d envelopes and refused %d of %d: the test proves little", n.flat, n.sql, len(recs))
	}
	if dead := f.count("SELECT count(*) FROM want WHERE dlq_reason IS NOT NULL"); dead < 100 {
		t.Fatalf("only %d dead letters among the envelopes", dead)
	}
}

// FuzzEnvelope: a record on a table topic that the flat decoder takes,
// whatever it holds, decodes to the same row or dead letter by the flat
// decoder as by parseSQL (one it refuses goes to parseSQL either way),
// and the consumer's quick look at its position (change.PeekSeq) reads
// the position the decoder does.
func FuzzEnvelope(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i, v := range typedEnvelopes(rng, 40) {
		if i%2 == 1 {
			v = mutate(rng, v)
		}
		f.Add(v)
	}
	fx, tb := typedFixture(f)
	defer fx.close()
	f.Fuzz(func(t *testing.T, v []byte) {
		if !tb.flat.decode(v) {
			return // parseSQL alone decodes it, either way
		}
		seq := tb.flat.row[3+2*len(tb.flat.cols)+flatSeq].(uint64)
		if got, ok := change.PeekSeq(v); !ok || uint64(got) != seq {
			t.Fatalf("PeekSeq reads %d, %v of an envelope at _cdc_seq %d: %s", got, ok, seq, v)
		}
		decodersAgree(t, fx, tb, []Record{{Topic: typedTopic, Value: v}})
	})
}

// typedFixture is a warehouse with the table typed, which has a flat
// decoder.
func typedFixture(t testing.TB) (*fixture, *table) {
	f := newFixture(t)
	if err := f.wh.ApplySchemas(context.Background(), []Schema{{typedTopic, typed}}, "lf._schemas", schemaPos(2), nil, nil); err != nil {
		t.Fatal(err)
	}
	tb := f.wh.byTopic[typedTopic]
	if tb.flat == nil {
		t.Fatal("typed has no flat decoder")
	}
	return f, tb
}

// decodersAgree decodes recs of tb's topic as a batch does, once by
// parseSQL alone (into the temp table want) and once with the flat
// decoder (got), and fails t where the rows, their types or the dead
// letters differ. It returns the flat decoding's counts.
func decodersAgree(t testing.TB, f *fixture, tb *table, recs []Record) staged {
	t.Helper()
	ctx := context.Background()
	decode := func(name string) staged {
		t.Helper()
		s, err := f.wh.Stage(ctx, recs)
		if err != nil {
			t.Fatal(err)
		}
		n := *s.tables[tb]
		if err := f.wh.decodeRows(ctx, tb, &n); err != nil {
			t.Fatal(err)
		}
		if _, err := f.wh.conn.ExecContext(ctx, fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS SELECT * FROM %s", name, decodedTable(tb.id))); err != nil {
			t.Fatal(err)
		}
		return n
	}
	flat := tb.flat
	tb.flat = nil
	decode("want")
	tb.flat = flat
	n := decode("got")
	types := "SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER BY column_index) FROM duckdb_columns() WHERE table_name = ?"
	var wantTypes, gotTypes string
	if err := f.wh.conn.QueryRowContext(ctx, types, "want").Scan(&wantTypes); err != nil {
		t.Fatal(err)
	}
	if err := f.wh.conn.QueryRowContext(ctx, types, "got").Scan(&gotTypes); err != nil {
		t.Fatal(err)
	}
	if gotTypes != wantTypes {
		t.Fatalf("rows table types\n got %s\nwant %s", gotTypes, wantTypes)
	}
	// Rows compare as text, where -0.0 is not 0.0.
	rows, err := f.wh.conn.QueryContext(ctx, `WITH g AS (SELECT kafka_offset, CAST(got AS VARCHAR) AS v FROM got),
		w AS (SELECT kafka_offset, CAST(want AS VARCHAR) AS v FROM want)
		SELECT 'only flat', * FROM (FROM g EXCEPT ALL FROM w) UNION ALL SELECT 'only parseSQL', * FROM (FROM w EXCEPT ALL FROM g) ORDER BY 2, 1 LIMIT 10`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var diff []string
	for rows.Next() {
		var side, row string
		var off int64
		if err := rows.Scan(&side, &off, &row); err != nil {
			t.Fatal(err)
		}
		diff = append(diff, fmt.Sprintf("%s: %s\n  envelope %s", side, row, recs[off].Value))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(diff) > 0 {
		t.Fatalf("the two decodings differ:\n%s", strings.Join(diff, "\n"))
	}
	return n
}

// BenchmarkDecode decodes about 20,000 envelopes of typed, those a flat
// decoder takes: stage and rows table, as a batch does, by parseSQL
// alone and by the flat decoder.
func BenchmarkDecode(b *testing.B) {
	for _, flat := range []bool{false, true} {
		b.Run("flat="+strconv.FormatBool(flat), func(b *testing.B) {
			f, tb := typedFixture(b)
			defer f.close()
			ctx := context.Background()
			var recs []Record
			for _, v := range typedEnvelopes(rand.New(rand.NewPCG(1, 2)), 28000) {
				if tb.flat.decode(v) { // values as most tables hold, not edges
					recs = append(recs, Record{Topic: typedTopic, Offset: int64(len(recs)), Value: v})
				}
			}
			if !flat {
				tb.flat = nil
			}
			b.ResetTimer()
			for range b.N {
				s, err := f.wh.Stage(ctx, recs)
				if err != nil {
					b.Fatal(err)
				}
				if err := f.wh.decodeRows(ctx, tb, s.tables[tb]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "envelopes/s")
		})
	}
}
