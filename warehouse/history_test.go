package warehouse

import (
	"context"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
)

// history renders silver.acct_history as "id name from→to [current]"
// lines, times as the seq of the change (the fixture's commit times).
func (f *fixture) history() string {
	f.t.Helper()
	var s string
	err := f.wh.conn.QueryRowContext(context.Background(), `SELECT coalesce(string_agg(
		id || ' ' || coalesce(name, '∅') || ' ' || (epoch_us(valid_from) - 1709251199000000) || '→' ||
		coalesce((epoch_us(valid_to) - 1709251199000000)::VARCHAR, '') || CASE WHEN is_current THEN ' current' ELSE '' END,
		chr(10) ORDER BY id, _cdc_seq, _cdc_ord), '') FROM silver.acct_history`).Scan(&s)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func expectHistory(t *testing.T, f *fixture, want string) {
	t.Helper()
	if got := f.history(); got != want {
		t.Fatalf("silver.acct_history:\n%s\nwant:\n%s", got, want)
	}
}

// TestHistoryIsTheCommittedVersions: each transaction's last change of a
// key is a version, whatever the batch boundaries, the order of the
// changes inside a batch, and replays; a delete closes the version and a
// re-insert opens a new one; a quarantined change opens none; a truncate
// closes every open version.
func TestHistoryIsTheCommittedVersions(t *testing.T) {
	const want = `1 a 100→200
1 b 200→300
1 c 300→400
1 e 400→500
1 f 600→800
2 x 100→700
3 y 200→800`
	events := func(f *fixture) []Record {
		return []Record{
			f.rec(change.OpCreate, 100, 1, "1", "a", ""),
			f.rec(change.OpCreate, 100, 2, "2", "x", ""),
			f.rec(change.OpUpdate, 200, 1, "1", "b", ""),
			f.rec(change.OpCreate, 200, 2, "3", "y", ""),
			f.rec(change.OpUpdate, 300, 1, "1", "c", ""),
			f.rec(change.OpUpdate, 400, 1, "1", "d", ""), // overwritten in its transaction
			f.rec(change.OpUpdate, 400, 2, "1", "e", ""),
			f.rec(change.OpDelete, 500, 1, "1", "e", ""),
			f.rec(change.OpCreate, 600, 1, "1", "f", ""),
			f.rec(change.OpUpdate, 650, 1, "1", "bad", ""), // quarantined
			f.rec(change.OpDelete, 700, 1, "2", "x", ""),
			f.rec(change.OpTruncate, 800, 1),
		}
	}
	rules := "[[rules]]\nname = \"named\"\ncheck = \"name <> 'bad'\"\n"
	for name, split := range map[string]func(f *fixture, recs []Record){
		"one batch": func(f *fixture, recs []Record) { f.apply(recs...) },
		"one batch, shuffled": func(f *fixture, recs []Record) {
			f.apply(recs[7], recs[0], recs[11], recs[3], recs[9], recs[1], recs[10], recs[5], recs[2], recs[8], recs[6], recs[4])
		},
		"a batch per event": func(f *fixture, recs []Record) {
			for _, r := range recs {
				f.apply(r)
			}
		},
		"replayed": func(f *fixture, recs []Record) {
			f.apply(recs[:6]...)
			f.apply(recs...)
			f.apply(recs[4:]...)
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			defer f.close()
			f.contract("history = true", rules)
			split(f, events(f))
			expectHistory(t, f, want)
		})
	}
}

// TestHistoryStartsFromSilver: a table whose contract asks for history
// later starts it from silver's live rows.
func TestHistoryStartsFromSilver(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""), f.rec(change.OpCreate, 100, 2, "2", "b", ""),
		f.rec(change.OpDelete, 200, 1, "2", "b", ""))
	f.contract("history = true", "")
	f.apply(f.rec(change.OpUpdate, 300, 1, "1", "a2", ""))
	expectHistory(t, f, "1 a 100→300\n1 a2 300→ current")
}

// TestHistoryFollowsSchemaChanges: the history table gains, renames and
// retypes columns with silver.
func TestHistoryFollowsSchemaChanges(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	f.contract("history = true", "")
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""))
	ctx := context.Background()
	next := &change.Table{Schema: acct.Schema, Name: acct.Name, Accepted: true, Renames: map[string]string{"title": "name"},
		Columns: []change.Column{acct.Columns[0], {Name: "title", Type: acct.Columns[1].Type}, acct.Columns[2],
			{Name: "note", Type: change.Type{Kind: change.KindText, Name: "text"}}}}
	if err := f.wh.ApplySchemas(ctx, []Schema{{topic, next}}, "lf._schemas", schemaPos(2), nil, nil); err != nil {
		t.Fatal(err)
	}
	cols := func(table string) string {
		var s string
		err := f.wh.conn.QueryRowContext(ctx, `SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER BY column_index)
			FROM duckdb_columns() WHERE schema_name = 'silver' AND table_name = ? AND NOT starts_with(column_name, '_') AND column_name NOT IN ('valid_from', 'valid_to', 'is_current')`, table).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got, want := cols("acct_history"), cols("acct"); got != want {
		t.Fatalf("history columns %q, silver's %q", got, want)
	}
	var title string
	if err := f.wh.conn.QueryRowContext(ctx, "SELECT title FROM silver.acct_history").Scan(&title); err != nil || title != "a" {
		t.Fatalf("renamed column in history: %q, %v", title, err)
	}
	// note dropped, then title renamed to note: both tables keep the
	// dropped note under a name of its own.
	dropped := &change.Table{Schema: acct.Schema, Name: acct.Name, Accepted: true, Columns: next.Columns[:3]}
	renamed := &change.Table{Schema: acct.Schema, Name: acct.Name, Accepted: true, Renames: map[string]string{"note": "title"},
		Columns: []change.Column{acct.Columns[0], {Name: "note", Type: acct.Columns[1].Type}, acct.Columns[2]}}
	for i, s := range []*change.Table{dropped, renamed} {
		if err := f.wh.ApplySchemas(ctx, []Schema{{topic, s}}, "lf._schemas", schemaPos(int64(3+i)), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := cols("acct_history"), cols("acct"); got != want || !strings.Contains(got, "note_dropped VARCHAR") {
		t.Fatalf("history columns %q, silver's %q", got, want)
	}
	if err := f.wh.conn.QueryRowContext(ctx, "SELECT note FROM silver.acct_history").Scan(&title); err != nil || title != "a" {
		t.Fatalf("renamed column in history: %q, %v", title, err)
	}
}
