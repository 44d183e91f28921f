package change

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s changed:\n got %s\nwant %s\n(run go test -update if the change is intended)", path, got, want)
	}
}

var orders = &Table{Schema: "public", Name: "orders", Columns: []Column{
	{Name: "id", Type: Type{Kind: KindInt8, Name: "bigint"}, Key: true},
	{Name: "status", Type: Type{Kind: KindText, Name: "text"}},
	{Name: "total", Type: Type{Kind: KindNumeric, Name: "numeric(12,2)", Precision: 12, Scale: 2}},
	{Name: "created_at", Type: Type{Kind: KindTimestampTZ, Name: "timestamp with time zone"}},
	{Name: "tags", Type: Type{Kind: KindText, Name: "text[]", Dims: 1}},
}}

func row(vals ...string) []Datum {
	out := make([]Datum, len(vals))
	for i, v := range vals {
		if v == "\x00" {
			out[i] = Datum{Null: true}
		} else {
			out[i] = Datum{Text: []byte(v)}
		}
	}
	return out
}

// TestEnvelopeGolden pins the record format other Kafka consumers rely on.
func TestEnvelopeGolden(t *testing.T) {
	env := Envelope{Name: "lakeflow", Database: "shop"}
	commit := int64(1709251199123456)
	events := []Event{
		{Table: orders, Op: OpRead, Pos: Position{Seq: 0x1000}, LSN: 0x1000, Commit: commit, Snapshot: SnapshotRow,
			After: row("1", "pending", "10.50", "2024-02-29 23:59:59.123456+00", "{a,\"b c\"}")},
		{Table: orders, Op: OpUpdate, Pos: Position{Seq: 0x2000, Ord: 1}, LSN: 0x1f00, TxID: 742, Commit: commit, Snapshot: SnapshotNone,
			Before: row("1", "pending", "10.50", "2024-02-29 23:59:59.123456+00", "\x00"),
			After:  row("1", "paid", "10.50", "2024-02-29 23:59:59.123456+00", "{}")},
		{Table: orders, Op: OpDelete, Pos: Position{Seq: 0x3000, Ord: 2}, LSN: 0x2f00, TxID: 743, Commit: commit, Snapshot: SnapshotNone,
			Before: row("1", "paid", "\x00", "2024-02-29 23:59:59.123456+00", "\x00")},
		{Table: orders, Op: OpTruncate, Pos: Position{Seq: 0x4000, Ord: 1}, LSN: 0x3f00, TxID: 744, Commit: commit, Snapshot: SnapshotNone},
		{Table: orders, Op: OpDelete, Pos: Position{Seq: 0x5000, Ord: 1}, LSN: 0x4f00, TxID: 745, Commit: commit, Snapshot: SnapshotNone,
			Before: row("2", "\x00", "\x00", "\x00", "\x00"), KeyOnly: true},
	}
	var out []byte
	for i := range events {
		key, err := env.AppendKey(nil, &events[i])
		if err != nil {
			t.Fatal(err)
		}
		val, err := env.AppendValue(nil, &events[i], 1709251200000)
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(val) || (len(key) > 0 && !json.Valid(key)) {
			t.Fatalf("event %d: invalid JSON key %s value %s", i, key, val)
		}
		out = append(out, key...)
		out = append(out, '\t')
		out = append(out, val...)
		out = append(out, '\n')
	}
	golden(t, "envelope", out)
}

func BenchmarkEnvelope(b *testing.B) {
	env := Envelope{Name: "lakeflow", Database: "shop"}
	ev := Event{Table: orders, Op: OpUpdate, Pos: Position{Seq: 0x2000, Ord: 1}, LSN: 0x1f00, TxID: 742, Commit: 1709251199123456,
		Snapshot: SnapshotNone,
		Before:   row("1", "pending", "10.50", "2024-02-29 23:59:59.123456+00", "\x00"),
		After:    row("1", "paid", "10.50", "2024-02-29 23:59:59.123456+00", "{x}")}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = env.AppendKey(buf[:0], &ev)
		buf, _ = env.AppendValue(buf, &ev, 1709251200000)
	}
	b.SetBytes(int64(len(buf)))
}
