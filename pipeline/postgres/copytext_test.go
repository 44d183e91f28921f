package postgres

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
)

func TestCopyReaderUnescapesAndSplitsRows(t *testing.T) {
	input := "1\ta\\tb\\\\c\\nd\t\\N\n2\t\t\\x41\\101\\\\N\n"
	want := [][]string{{"1", "a\tb\\c\nd", "NULL"}, {"2", "", "AA\\N"}}
	// Every split of the input into two writes gives the same rows.
	for cut := 0; cut <= len(input); cut++ {
		var got [][]string
		r := newCopyReader(3, func(row []change.Datum) error {
			var vals []string
			for _, d := range row {
				if d.Null {
					vals = append(vals, "NULL")
				} else {
					if d.Text == nil {
						t.Fatal("non-NULL value without text")
					}
					vals = append(vals, string(d.Text))
				}
			}
			got = append(got, vals)
			return nil
		})
		if _, err := r.Write([]byte(input[:cut])); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Write([]byte(input[cut:])); err != nil {
			t.Fatal(err)
		}
		if err := r.finish(); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || strings.Join(got[0], "|") != strings.Join(want[0], "|") || strings.Join(got[1], "|") != strings.Join(want[1], "|") {
			t.Fatalf("cut %d: got %q, want %q", cut, got, want)
		}
	}
	r := newCopyReader(2, func([]change.Datum) error { return nil })
	if _, err := r.Write([]byte("1\t2\t3\n")); err == nil {
		t.Error("row with too many columns accepted")
	}
}

// FuzzCopyText: whatever COPY sends, the rows read do not depend on how
// the stream is cut into writes, and a row written back as PostgreSQL
// writes text (CopyAttributeOutText's escapes) reads as the same row.
func FuzzCopyText(f *testing.F) {
	f.Add([]byte("1\ta\\tb\\\\c\\nd\t\\N\n2\t\t\\x41\\101\\\\N\n"), uint8(3), uint16(9))
	f.Add([]byte("\\x\\xg\\8\\777\\\n"), uint8(1), uint16(3))
	f.Add([]byte("ü\\r\\v\\b\\f\t\\N\n"), uint8(2), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, columns uint8, cut uint16) {
		n := int(columns%8) + 1
		read := func(writes ...[]byte) (rows [][]change.Datum, err error) {
			r := newCopyReader(n, func(row []change.Datum) error {
				out := make([]change.Datum, len(row))
				for i, d := range row {
					if !d.Null && d.Text == nil {
						t.Fatal("a value that is not NULL has no text")
					}
					out[i] = change.Datum{Null: d.Null, Text: bytes.Clone(d.Text)}
				}
				rows = append(rows, out)
				return nil
			})
			for _, w := range writes {
				if _, err := r.Write(w); err != nil {
					return rows, err
				}
			}
			return rows, r.finish()
		}
		whole, err := read(data)
		at := int(cut) % (len(data) + 1)
		split, err2 := read(data[:at], data[at:])
		if (err == nil) != (err2 == nil) || !sameRows(whole, split) {
			t.Fatalf("cut at %d reads %v (%v), whole %v (%v)", at, split, err2, whole, err)
		}
		var out []byte
		for _, row := range whole {
			for i, d := range row {
				if i > 0 {
					out = append(out, '\t')
				}
				out = escapeCopy(out, d)
			}
			out = append(out, '\n')
		}
		again, err := read(out)
		if err != nil || !sameRows(whole, again) {
			t.Fatalf("rows written back as %q read as %v (%v), want %v", out, again, err, whole)
		}
	})
}

// escapeCopy appends d as COPY's text format writes it.
func escapeCopy(dst []byte, d change.Datum) []byte {
	if d.Null {
		return append(dst, `\N`...)
	}
	for _, c := range d.Text {
		switch c {
		case '\\':
			dst = append(dst, `\\`...)
		case '\b':
			dst = append(dst, `\b`...)
		case '\f':
			dst = append(dst, `\f`...)
		case '\n':
			dst = append(dst, `\n`...)
		case '\r':
			dst = append(dst, `\r`...)
		case '\t':
			dst = append(dst, `\t`...)
		case '\v':
			dst = append(dst, `\v`...)
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

func sameRows(a, b [][]change.Datum) bool {
	return slices.EqualFunc(a, b, func(x, y []change.Datum) bool {
		return slices.EqualFunc(x, y, func(p, q change.Datum) bool { return p.Null == q.Null && bytes.Equal(p.Text, q.Text) })
	})
}
