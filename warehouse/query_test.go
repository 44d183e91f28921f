package warehouse

import (
	"context"
	"encoding/csv"
	"strings"
	"testing"
)

// TestCSVWritesTimestampsAsDuckDBDoes: CSV output gives every
// TIMESTAMPTZ the text DuckDB gives it (finite or not, before the common
// era, in another zone, NULL), under the column names DuckDB gives,
// duplicates included.
func TestCSVWritesTimestampsAsDuckDBDoes(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	q := `SELECT x, x AS x, 1 AS "we""ird", x::DATE AS d FROM (VALUES (TIMESTAMPTZ 'infinity'), (TIMESTAMPTZ '-infinity'),
		(TIMESTAMPTZ '0044-03-15 (BC) 12:00:00+00'), (TIMESTAMPTZ '2024-07-01 09:00:00.5+02'), (NULL),
		(TIMESTAMPTZ '1969-12-31 23:59:59.000001+00'), (TIMESTAMPTZ '9999-12-31 23:59:59.999999+00')) v(x) ORDER BY x NULLS LAST`
	want, err := f.wh.Query(context.Background(), q, false)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := f.wh.CSV(context.Background(), q, &b); err != nil {
		t.Fatal(err)
	}
	got, err := csv.NewReader(strings.NewReader(b.String())).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got[0], ",") != strings.Join(want.Columns, ",") {
		t.Fatalf("CSV header %q, want %q", got[0], want.Columns)
	}
	if len(got)-1 != len(want.Rows) {
		t.Fatalf("CSV has %d rows, want %d", len(got)-1, len(want.Rows))
	}
	for i, row := range want.Rows {
		for j, v := range row {
			text := ""
			if v != nil {
				text = *v
			}
			if got[i+1][j] != text {
				t.Errorf("row %d column %s: CSV %q, DuckDB's text %q", i+1, want.Columns[j], got[i+1][j], text)
			}
		}
	}
}

// TestReaderRunsMartSQL: the published warehouse's reader (lakeflow sql)
// knows lakeflow_utc_date, as the pipeline that runs the marts does.
func TestReaderRunsMartSQL(t *testing.T) {
	f := newFixture(t)
	path := f.wh.path
	f.close()
	r, err := OpenReader(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var day string
	if err := r.QueryRow(context.Background(), "SELECT lakeflow_utc_date(TIMESTAMPTZ '2024-07-01 01:00:00+02')::VARCHAR", &day); err != nil {
		t.Fatal(err)
	}
	if day != "2024-06-30" {
		t.Fatalf("lakeflow_utc_date gave %s, want 2024-06-30", day)
	}
}
