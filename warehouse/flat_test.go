package warehouse

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/change"
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
}}

// typedValues are PostgreSQL texts per column of typed, edges first.
var typedValues = [][]string{
	{"0", "1", "-9223372036854775808", "9223372036854775807", "42"},
	{"0", "-32768", "32767", "7"},
	{"0", "-2147483648", "2147483647", "-1"},
	{"t", "f"},
	{"", "plain", `quote " and \ backslash`, "line\nbreak\ttab\rreturn", "\x01ctl\x1f\x7f", "ünïcødé 😀", "null", " padded "},
	{"192.168.0.1/24", "::1"},
	{"NaN", "123.4500", "-0.1", "0.00001", "99999999999999999999999999999999999999999"},
	{"2024-02-29 23:59:59.123456+00", "0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00", "infinity", "-infinity",
		"1000-01-01 00:00:00+00 BC", "294276-12-31 23:59:59+00", "1970-01-01 00:00:00+00", "2024-01-01 12:00:00.5+00"},
	{`\x`, `\x00ff10`, `\xdeadbeef`},
}

// typedEnvelopes are envelopes of typed as the producer writes them,
// every op, NULLs and key-only deletes among them.
func typedEnvelopes(rng *rand.Rand, n int) [][]byte {
	env := change.Envelope{Name: "lf", Database: "db"}
	var out [][]byte
	for i := range n {
		row := make([]change.Datum, len(typed.Columns))
		for c, vals := range typedValues {
			v := vals[rng.IntN(len(vals))]
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

var keyValue = regexp.MustCompile(`"id":-?[0-9]+`)

// mutate spoils or respells an envelope: some of its variants mean the
// same to from_json, others are dead letters.
func mutate(rng *rand.Rand, v []byte) []byte {
	v = bytes.Clone(v)
	swaps := [][2]string{
		{`"_cdc_seq":`, `"_cdc_seq" :`}, {`"op":"`, `"op":"x`}, {`"small":`, `"small":1.0e0,"x":`}, {`"int":`, `"int":"5","y":`},
		{`"int":`, `"int":2147483648,"y":`}, {`"small":`, `"small":-0,"x":`}, {`"id":`, `"id":null,"z":`},
		{`"_cdc_ord":`, `"_cdc_ord":4294967296,"q":`}, {`"plain"`, `"pl\/ain"`}, {`"plain"`, `"pl\u0061in"`},
		{`"plain"`, `"plain\u0000"`}, {`"flag":`, `"flag":"true","w":`}, {`"txId":`, `"txId":-1,"r":`},
		{`"lsn":`, `"lsn":"1","r":`}, {`,"_commit_ts":"`, `,"_commit_ts":"x`}, {`"_cdc_ord":`, `"op":"c","_cdc_ord":`},
		{`"at":"`, `"at":"2024-02-30T00:00:00Z","k":"`}, {`"raw":"`, `"raw":"AB=","k":"`}, {`"raw":"`, `"raw":"@@","k":"`},
		{`"source":{`, `"source":{"extra":1,`}, {`}`, `} `}, {`Z"`, `+00:00"`}, {`"before":null`, `"before":{}`},
		{`"_before_key_only":true`, `"_before_key_only":false`}, {`"transaction":null`, `"transaction":{"id":"1"}`},
	}
	switch k := rng.IntN(len(swaps) + 4); {
	case k < len(swaps):
		return bytes.Replace(v, []byte(swaps[k][0]), []byte(swaps[k][1]), 1)
	case k == len(swaps)+3:
		return keyValue.ReplaceAll(v, []byte(`"id":null`))
	case k == len(swaps):
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
	f := newFixture(t)
	defer f.close()
	ctx := context.Background()
	if err := f.wh.ApplySchemas(ctx, []Schema{{typedTopic, typed}}, "lf._schemas", schemaPos(2), nil); err != nil {
		t.Fatal(err)
	}
	tb := f.wh.byTopic[typedTopic]
	if tb.flat == nil {
		t.Fatal("typed has no flat decoder")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	var recs []Record
	for i, v := range typedEnvelopes(rng, 3000) {
		if i%2 == 1 {
			v = mutate(rng, v)
		}
		recs = append(recs, Record{Topic: typedTopic, Offset: int64(i), Value: v})
	}
	decode := func(name string) staged {
		t.Helper()
		if err := f.wh.stage(ctx, recs); err != nil {
			t.Fatal(err)
		}
		n := f.wh.staged[tb]
		if err := f.wh.decodeRows(ctx, tb); err != nil {
			t.Fatal(err)
		}
		if _, err := f.wh.conn.ExecContext(ctx, fmt.Sprintf("CREATE OR REPLACE TEMP TABLE %s AS SELECT * FROM %s", name, rowsTable(tb.id))); err != nil {
			t.Fatal(err)
		}
		return n
	}
	flat := tb.flat
	tb.flat = nil
	decode("want")
	tb.flat = flat
	n := decode("got")
	if n.flat < len(recs)/3 || n.sql < len(recs)/4 {
		t.Fatalf("the flat decoder took %d envelopes and refused %d of %d: the test proves little", n.flat, n.sql, len(recs))
	}
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
	if dead := f.count("SELECT count(*) FROM want WHERE dlq_reason IS NOT NULL"); dead < 100 {
		t.Fatalf("only %d dead letters among the envelopes", dead)
	}
	rows, err := f.wh.conn.QueryContext(ctx, `SELECT 'only flat', kafka_offset, CAST(got AS VARCHAR) FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM want) got
		UNION ALL SELECT 'only parseSQL', kafka_offset, CAST(want AS VARCHAR) FROM (SELECT * FROM want EXCEPT ALL SELECT * FROM got) want ORDER BY 2, 1 LIMIT 10`)
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
}

// BenchmarkDecode decodes about 20,000 envelopes of typed, those a flat
// decoder takes: stage and rows table, as a batch does, by parseSQL
// alone and by the flat decoder.
func BenchmarkDecode(b *testing.B) {
	for _, flat := range []bool{false, true} {
		b.Run("flat="+strconv.FormatBool(flat), func(b *testing.B) {
			f := newFixture(b)
			defer f.close()
			ctx := context.Background()
			if err := f.wh.ApplySchemas(ctx, []Schema{{typedTopic, typed}}, "lf._schemas", schemaPos(2), nil); err != nil {
				b.Fatal(err)
			}
			tb := f.wh.byTopic[typedTopic]
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
				if err := f.wh.stage(ctx, recs); err != nil {
					b.Fatal(err)
				}
				if err := f.wh.decodeRows(ctx, tb); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "envelopes/s")
		})
	}
}
