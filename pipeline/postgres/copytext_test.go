package postgres

import (
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/change"
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
