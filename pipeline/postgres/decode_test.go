package postgres

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
)

// Builders of pgoutput protocol-1 messages.

func u64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }
func u32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }

func beginMsg(final change.LSN, xid uint32) []byte {
	return u32(u64(u64([]byte{'B'}, uint64(final)), 1000), xid)
}

func commitMsg(commit, end change.LSN) []byte {
	return u64(u64(u64([]byte{'C', 0}, uint64(commit)), uint64(end)), 1000)
}

// tuple encodes values: "\x00" is NULL, "\x01" is unchanged TOAST.
func tuple(vals ...string) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(vals)))
	for _, v := range vals {
		switch v {
		case "\x00":
			b = append(b, 'n')
		case "\x01":
			b = append(b, 'u')
		default:
			b = append(u32(append(b, 't'), uint32(len(v))), v...)
		}
	}
	return b
}

func rowMsg(kind byte, rel uint32, parts ...[]byte) []byte {
	b := u32([]byte{kind}, rel)
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

var testTable = &change.Table{Schema: "public", Name: "t", Columns: []change.Column{
	{Name: "id", Type: change.Type{Kind: change.KindInt4}, Key: true},
	{Name: "v", Type: change.Type{Kind: change.KindText}},
	{Name: "big", Type: change.Type{Kind: change.KindText}},
}}

func text(d change.Datum) string {
	switch {
	case d.Null:
		return "NULL"
	case d.Unchanged():
		return "UNCHANGED"
	}
	return string(d.Text)
}

func TestDecodeTransaction(t *testing.T) {
	d := NewDecoder()
	d.SetTable(7, testTable)
	const final = change.LSN(0x5000)
	steps := []struct {
		msg  []byte
		want []string // "op id v big ord" per event
	}{
		{msg: beginMsg(final, 99)},
		{msg: rowMsg('I', 7, []byte{'N'}, tuple("1", "a", "\x00")), want: []string{"c 1 a NULL 1"}},
		// Unchanged TOAST in the new tuple is taken from the old one.
		{msg: rowMsg('U', 7, []byte{'O'}, tuple("1", "a", "huge"), []byte{'N'}, tuple("1", "b", "\x01")), want: []string{"u 1 b huge 2"}},
		// A primary-key update is a delete of the old key and a create.
		{msg: rowMsg('U', 7, []byte{'O'}, tuple("1", "b", "huge"), []byte{'N'}, tuple("2", "b", "huge")), want: []string{"d 1 b huge 3", "c 2 b huge 4"}},
		{msg: rowMsg('D', 7, []byte{'O'}, tuple("2", "", "huge")), want: []string{"d 2  huge 5"}},
		{msg: u32(append(u32([]byte{'T'}, 1), 0), 7), want: []string{"t 6"}},
	}
	for i, st := range steps {
		res, err := d.Decode(st.msg, change.LSN(0x4000+i))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if len(res.Events) != len(st.want) {
			t.Fatalf("step %d: %d events, want %d", i, len(res.Events), len(st.want))
		}
		for j, ev := range res.Events {
			if ev.Pos.Seq != final || ev.TxID != 99 || ev.LSN != change.LSN(0x4000+i) {
				t.Fatalf("step %d: position %s txid %d lsn %s", i, ev.Pos, ev.TxID, ev.LSN)
			}
			got := string(ev.Op)
			if img := ev.Image(); img != nil {
				got += " " + text(img[0]) + " " + text(img[1]) + " " + text(img[2])
			}
			got += " " + string(rune('0'+ev.Pos.Ord))
			if got != st.want[j] {
				t.Fatalf("step %d event %d: %q, want %q", i, j, got, st.want[j])
			}
		}
	}
	res, err := d.Decode(commitMsg(final, final+0x30), final+0x30)
	if err != nil || res.Kind != ResultCommit || res.End != final+0x30 || d.InTransaction() {
		t.Fatalf("commit: %+v %v", res, err)
	}
}

// Without REPLICA IDENTITY FULL (a partition attached later) an update
// may come without the old row and a delete or key change with the key
// alone: the new row is complete, and a delete needs only the key.
func TestDecodeWithoutFullIdentity(t *testing.T) {
	for name, tc := range map[string]struct {
		msg  []byte
		want string
	}{
		"update without old row": {rowMsg('U', 7, []byte{'N'}, tuple("1", "b", "c")), "u ∅ → 1 b c"},
		"delete with key only":   {rowMsg('D', 7, []byte{'K'}, tuple("1", "\x00", "\x00")), "d 1 NULL NULL → ∅"},
		"key change, key only": {rowMsg('U', 7, []byte{'K'}, tuple("1", "\x00", "\x00"), []byte{'N'}, tuple("2", "b", "c")),
			"d 1 NULL NULL → ∅, c ∅ → 2 b c"},
		// A large value left as it was: the warehouse takes it from the
		// version before.
		"toast without old row": {rowMsg('U', 7, []byte{'N'}, tuple("1", "b", "\x01")), "u ∅ → 1 b UNCHANGED"},
		"toast with key only": {rowMsg('U', 7, []byte{'K'}, tuple("1", "\x00", "\x00"), []byte{'N'}, tuple("1", "b", "\x01")),
			"u 1 NULL NULL → 1 b UNCHANGED"},
		"toast with full old row": {rowMsg('U', 7, []byte{'O'}, tuple("1", "a", "x"), []byte{'N'}, tuple("1", "b", "\x01")), "u 1 a x → 1 b x"},
	} {
		d := NewDecoder()
		d.SetTable(7, testTable)
		d.Decode(beginMsg(0x10, 1), 1)
		res, err := d.Decode(tc.msg, 2)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var got []string
		for _, ev := range res.Events {
			got = append(got, string(ev.Op)+" "+render(ev.Before)+" → "+render(ev.After))
		}
		if g := strings.Join(got, ", "); g != tc.want {
			t.Errorf("%s: %s, want %s", name, g, tc.want)
		}
	}
}

func render(row []change.Datum) string {
	if row == nil {
		return "∅"
	}
	var parts []string
	for _, d := range row {
		parts = append(parts, text(d))
	}
	return strings.Join(parts, " ")
}

func TestDecodeRefusesWhatItCannotRepresent(t *testing.T) {
	d := NewDecoder()
	d.Decode(beginMsg(0x10, 1), 1)
	if _, err := d.Decode(rowMsg('I', 8, []byte{'N'}, tuple("1")), 2); err == nil {
		t.Error("row of an unknown relation accepted")
	}
	if _, err := d.Decode(commitMsg(0x20, 0x30), 3); err == nil {
		t.Error("commit of another transaction accepted")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(rowMsg('I', 7, []byte{'N'}, tuple("1", "a", "\x00")))
	f.Add(rowMsg('U', 7, []byte{'O'}, tuple("1", "a", "x"), []byte{'N'}, tuple("1", "b", "\x01")))
	f.Add(commitMsg(0x10, 0x20))
	f.Add([]byte{'R', 0, 0, 0, 7})
	f.Fuzz(func(t *testing.T, msg []byte) {
		d := NewDecoder()
		d.SetTable(7, testTable)
		d.Decode(beginMsg(0x10, 1), 1)
		res, err := d.Decode(msg, 2)
		if err == nil && res.Kind == ResultRows {
			for _, ev := range res.Events {
				if ev.Op != change.OpTruncate && len(ev.Image()) != 3 {
					t.Fatalf("event with %d values", len(ev.Image()))
				}
			}
		}
	})
}

func BenchmarkDecodeUpdate(b *testing.B) {
	d := NewDecoder()
	d.SetTable(7, testTable)
	d.Decode(beginMsg(0x10, 1), 1)
	msg := rowMsg('U', 7, []byte{'O'}, tuple("1", "a", "x"), []byte{'N'}, tuple("1", "b", "\x01"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(msg, 2); err != nil {
			b.Fatal(err)
		}
	}
}
