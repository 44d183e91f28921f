package warehouse

import (
	"context"
	"reflect"
	"slices"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
)

// TestFormerNamesFollowRenames: a column renamed twice keeps both of its
// former names, each with where it ended, and keeps them once dropped
// (silver keeps it, and changes from before the drop its values).
func TestFormerNamesFollowRenames(t *testing.T) {
	col := func(name string) change.Column {
		return change.Column{Name: name, Type: change.Type{Kind: change.KindInt4, Name: "integer"}}
	}
	at := func(seq uint64) change.Position { return change.Position{Seq: change.LSN(seq)} }
	v1 := &change.Table{Schema: "public", Name: "t", Columns: []change.Column{col("a"), col("x")}}
	v2 := &change.Table{Schema: "public", Name: "t", Columns: []change.Column{col("b"), col("x")}, Since: at(10), Accepted: true, Renames: map[string]string{"b": "a"}}
	if _, err := evolve(v1, v2, false); err != nil {
		t.Fatal(err)
	}
	v3 := &change.Table{Schema: "public", Name: "t", Columns: []change.Column{col("c"), col("y")}, Since: at(20), Accepted: true, Renames: map[string]string{"c": "b", "y": "x"}}
	if _, err := evolve(v2, v3, false); err != nil {
		t.Fatal(err)
	}
	want := []change.Former{{Column: "c", Name: "a", Before: at(10)}, {Column: "c", Name: "b", Before: at(20)}, {Column: "y", Name: "x", Before: at(20)}}
	if !reflect.DeepEqual(v3.Formerly, want) {
		t.Fatalf("former names %+v, want %+v", v3.Formerly, want)
	}
	v4 := &change.Table{Schema: "public", Name: "t", Columns: []change.Column{col("y")}, Since: at(30), Accepted: true}
	if _, err := evolve(v3, v4, false); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(v4.Formerly, want) || retired(v4, "c") < 0 {
		t.Fatalf("after c was dropped: former names %+v, want %+v", v4.Formerly, want)
	}
}

// TestCreatedAndRetypedInOneCall: a table's first schema and a retype of
// it, read together (the snapshot's records and a DDL's in one look at
// the schema topic): each version's check runs on silver as the versions
// before it left it (the table did not exist before the call).
func TestCreatedAndRetypedInOneCall(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	typ := func(kind change.Kind, name string) change.Type { return change.Type{Kind: kind, Name: name} }
	v1 := &change.Table{Schema: "public", Name: "fresh", Columns: []change.Column{
		{Name: "id", Type: typ(change.KindInt4, "integer"), Key: true}, {Name: "a", Type: typ(change.KindInt2, "smallint")}}}
	v2 := &change.Table{Schema: "public", Name: "fresh", Since: change.Position{Seq: 5}, Columns: []change.Column{
		{Name: "id", Type: typ(change.KindInt4, "integer"), Key: true}, {Name: "a", Type: typ(change.KindInt4, "integer")}}}
	if err := f.wh.ApplySchemas(context.Background(), []Schema{{"lf.public.fresh", v1}, {"lf.public.fresh", v2}}, "lf._schemas", schemaPos(2), nil, nil); err != nil {
		t.Fatal(err)
	}
}

// TestFilledThenRenamedInOneCall: a column added with a default, then
// renamed, read together: silver's existing rows get the default under
// the column's new name (every fill runs after every ALTER).
func TestFilledThenRenamedInOneCall(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	ctx := context.Background()
	f.apply(f.rec(change.OpCreate, 100, 1, "1", "a", ""))
	n := change.Column{Name: "n", Type: change.Type{Kind: change.KindInt4, Name: "integer"}, Fill: change.Fill{Before: change.Position{Seq: 200}, Text: "5"}}
	v2 := &change.Table{Schema: acct.Schema, Name: acct.Name, Since: change.Position{Seq: 200}, Columns: append(slices.Clone(acct.Columns), n)}
	m := n
	m.Name = "m"
	v3 := &change.Table{Schema: acct.Schema, Name: acct.Name, Since: change.Position{Seq: 300}, Accepted: true, Renames: map[string]string{"m": "n"},
		Columns: append(slices.Clone(acct.Columns), m)}
	if err := f.wh.ApplySchemas(ctx, []Schema{{topic, v2}, {topic, v3}}, "lf._schemas", schemaPos(2), nil, nil); err != nil {
		t.Fatal(err)
	}
	var got int
	if err := f.wh.conn.QueryRowContext(ctx, "SELECT m FROM silver.acct WHERE id = 1").Scan(&got); err != nil || got != 5 {
		t.Fatalf("the row from before the column: m = %d, %v; want its default, 5", got, err)
	}
}

// TestKeyRetypeKeepsOneRowPerKey: keys that become one under a key
// column's new type (text '01', deleted, and '1', live, as integers: the
// source's retype saw only the live row) keep one silver row, the live
// one, even when the deleted one is newer.
func TestKeyRetypeKeepsOneRowPerKey(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	ctx := context.Background()
	typ := func(kind change.Kind, name string) change.Type { return change.Type{Kind: kind, Name: name} }
	v1 := &change.Table{Schema: "public", Name: "codes", Columns: []change.Column{
		{Name: "id", Type: typ(change.KindText, "text"), Key: true}, {Name: "a", Type: typ(change.KindText, "text")}}}
	v2 := &change.Table{Schema: "public", Name: "codes", Since: change.Position{Seq: 500}, Accepted: true, Columns: []change.Column{
		{Name: "id", Type: typ(change.KindInt4, "integer"), Key: true}, {Name: "a", Type: typ(change.KindText, "text")}}}
	if err := f.wh.ApplySchemas(ctx, []Schema{{"lf.public.codes", v1}}, "lf._schemas", schemaPos(1), nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wh.conn.ExecContext(ctx, `INSERT INTO silver.codes VALUES
		('1', 'live', 200, 1, now(), false), ('01', 'deleted later', 300, 1, now(), true), ('2', 'other', 100, 1, now(), false),
		('03', 'old', 100, 2, now(), true), ('3', 'newer', 400, 1, now(), true)`); err != nil {
		t.Fatal(err)
	}
	if err := f.wh.ApplySchemas(ctx, []Schema{{"lf.public.codes", v2}}, "lf._schemas", schemaPos(2), nil, nil); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := f.wh.conn.QueryRowContext(ctx, "SELECT string_agg(id || ' ' || a, ', ' ORDER BY id) FROM silver.codes").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "1 live, 2 other, 3 newer"; got != want {
		t.Fatalf("silver after the key's retype: %s, want %s", got, want)
	}
}
