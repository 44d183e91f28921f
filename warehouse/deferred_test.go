package warehouse

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// refFixture is a warehouse with tables g, p and c, each with an int key
// id; c.pid references p, and with chain p.gid references g.
type refFixture struct {
	t   *testing.T
	wh  *Warehouse
	off map[string]int64
	pos int64 // of the schema topic
}

var (
	intType = change.Type{Kind: change.KindInt4, Name: "integer"}
	refG    = &change.Table{Schema: "public", Name: "g", Columns: []change.Column{{Name: "id", Type: intType, Key: true}}}
	refP    = &change.Table{Schema: "public", Name: "p", Columns: []change.Column{{Name: "id", Type: intType, Key: true}, {Name: "gid", Type: intType}}}
	refC    = &change.Table{Schema: "public", Name: "c", Columns: []change.Column{{Name: "id", Type: intType, Key: true}, {Name: "pid", Type: intType}}}
)

func newRefFixture(t *testing.T, chain bool) *refFixture {
	return newRefFixtureOf(t, chain, refG, refP, refC)
}

// newRefFixtureOf is a refFixture whose warehouse knows only tables.
func newRefFixtureOf(t *testing.T, chain bool, tables ...*change.Table) *refFixture {
	dir := t.TempDir()
	lk, err := lake.Open(filepath.Join(dir, "lake"))
	if err != nil {
		t.Fatal(err)
	}
	f := &refFixture{t: t, off: map[string]int64{}}
	if f.wh, err = Open(context.Background(), config.Warehouse{Path: filepath.Join(dir, "w.duckdb")}, lk, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.wh.Close() })
	f.learn(tables...)
	head := "key = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integer\"\n"
	files := map[string]string{
		"g.toml": "table = \"public.g\"\n" + head,
		"p.toml": "table = \"public.p\"\n" + head + "[[columns]]\nname = \"gid\"\ntype = \"integer\"\n",
		"c.toml": "table = \"public.c\"\n" + head + "[[columns]]\nname = \"pid\"\ntype = \"integer\"\n" +
			"[[rules]]\nname = \"p_exists\"\nreferences = \"public.p\"\non = { pid = \"id\" }\n" +
			"[[rules]]\nname = \"not_seven\"\ncheck = \"pid <> 7\"\n",
	}
	if chain {
		files["p.toml"] += "[[rules]]\nname = \"g_exists\"\nreferences = \"public.g\"\non = { gid = \"id\" }\n"
	}
	cdir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(cdir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set, err := contracts.Load(cdir)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.wh.SetContracts(context.Background(), set); err != nil {
		t.Fatal(err)
	}
	return f
}

// learn gives the warehouse the schemas of tables.
func (f *refFixture) learn(tables ...*change.Table) {
	f.t.Helper()
	var schemas []Schema
	for _, tb := range tables {
		schemas = append(schemas, Schema{"lf.public." + tb.Name, tb})
	}
	f.pos++
	if err := f.wh.ApplySchemas(context.Background(), schemas, "lf._schemas", schemaPos(f.pos), nil, nil); err != nil {
		f.t.Fatal(err)
	}
}

// insert is the record of an insert into tb at seq.
func (f *refFixture) insert(tb *change.Table, seq change.LSN, ord uint32, vals ...string) Record {
	row := make([]change.Datum, len(vals))
	for i, v := range vals {
		row[i] = change.Datum{Text: []byte(v)}
	}
	ev := change.Event{Table: tb, Op: change.OpCreate, Pos: change.Position{Seq: seq, Ord: ord}, LSN: seq, Commit: 1709251199000000, After: row}
	val, err := (&change.Envelope{Name: "lf", Database: "db"}).AppendValue(nil, &ev, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	topic := "lf.public." + tb.Name
	f.off[topic]++
	return Record{Topic: topic, Offset: f.off[topic] - 1, Value: val}
}

// apply applies recs as a batch: a part of the transaction at open, or,
// with open 0, one that ends consistent at end.
func (f *refFixture) apply(open, end change.LSN, recs ...Record) {
	f.t.Helper()
	b := Batch{Records: recs, Positions: map[string]TopicPosition{}, Open: open}
	for _, r := range recs {
		pos, ok := b.Positions[r.Topic]
		if !ok {
			pos = TopicPosition{ID: "era", Next: map[int32]int64{}}
			b.Positions[r.Topic] = pos
		}
		pos.Next[r.Partition] = max(pos.Next[r.Partition], r.Offset+1)
	}
	if open == 0 {
		b.Watermark = &change.Watermark{Seq: end, End: end + 1}
	}
	if _, err := f.wh.Apply(context.Background(), b); err != nil {
		f.t.Fatal(err)
	}
}

func (f *refFixture) query(q string) string {
	f.t.Helper()
	var s string
	if err := f.wh.conn.QueryRowContext(context.Background(), q).Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

// TestDeferredUntilTheTransactionEnds: a transaction applied in three
// parts (a snapshot's rows, sharing one position) writes children before
// their parent; the children that fail p_exists in a part are deferred,
// not quarantined, stay deferred through the next part, and the batch
// that ends the transaction judges them: the child whose parent came
// applies, the one whose parent never did is quarantined, and the one
// the part quarantined for a row rule (its parent in silver) stays
// quarantined once.
func TestDeferredUntilTheTransactionEnds(t *testing.T) {
	f := newRefFixture(t, false)
	f.apply(0, 50, f.insert(refP, 50, 1, "7", "5"))
	f.apply(100, 0, f.insert(refC, 100, 0, "1", "1"), f.insert(refC, 100, 0, "2", "9"), f.insert(refC, 100, 0, "3", "7"))
	f.apply(100, 0, f.insert(refG, 100, 0, "5"))
	if got := f.query("SELECT count(*)::VARCHAR || '/' || (SELECT count(*) FROM lakeflow.quarantine) || '/' || (SELECT count(*) FROM silver.c) FROM lakeflow.deferred"); got != "2/1/0" {
		t.Fatalf("deferred/quarantined/in silver after two parts: %s, want 2/1/0", got)
	}
	f.apply(0, 100, f.insert(refP, 100, 0, "1", "5"))
	if got := f.query("SELECT coalesce(string_agg(id::VARCHAR, ','), '') FROM silver.c"); got != "1" {
		t.Errorf("silver.c holds %q, want the child whose parent came", got)
	}
	if got := f.query("SELECT coalesce(string_agg(key::VARCHAR || ' ' || rules[1], ',' ORDER BY key::VARCHAR), '') FROM lakeflow.quarantine"); got != `{"id":2} c.p_exists,{"id":3} c.not_seven` {
		t.Errorf("quarantine holds %q, want the child whose parent never came and the one that broke a row rule, once each", got)
	}
	if got := f.query("SELECT count(*)::VARCHAR FROM lakeflow.deferred"); got != "0" {
		t.Errorf("%s changes still deferred once the transaction ended", got)
	}
}

// TestReferenceChainThroughAnUntouchedTable: c references p, which
// references g; a batch of c alone judges c's rule and nothing of p's
// (it used to read p's rows of the batch, which do not exist, and stop
// every run).
func TestReferenceChainThroughAnUntouchedTable(t *testing.T) {
	f := newRefFixture(t, true)
	f.apply(0, 50, f.insert(refG, 50, 1, "1"), f.insert(refP, 50, 2, "1", "1"))
	f.apply(0, 60, f.insert(refC, 60, 1, "1", "1"))
	if got := f.query("SELECT count(*)::VARCHAR FROM silver.c"); got != "1" {
		t.Fatalf("silver.c holds %s rows, want 1", got)
	}
}

// TestDeferredBeforeTheReferencedTableIsKnown: a snapshot's part holds
// children before the schema of the table they reference has arrived
// (the snapshot has not reached it): they are deferred, where the batch
// used to stop, and judged once the transaction ends.
func TestDeferredBeforeTheReferencedTableIsKnown(t *testing.T) {
	f := newRefFixtureOf(t, false, refC)
	f.apply(100, 0, f.insert(refC, 100, 0, "1", "1"))
	f.learn(refP)
	f.apply(0, 100, f.insert(refP, 100, 0, "1", "5"))
	if got := f.query("SELECT count(*)::VARCHAR || '/' || (SELECT count(*) FROM lakeflow.quarantine) FROM silver.c"); got != "1/0" {
		t.Fatalf("in silver/quarantined: %s, want 1/0", got)
	}
}

// TestDeferredChangesWhoseLakeFileIsGone: a lake file holding deferred
// changes was removed by hand before the transaction ended. The batch
// that ends it says they are lost and applies the rest: a stop there
// would come back at every start.
func TestDeferredChangesWhoseLakeFileIsGone(t *testing.T) {
	f := newRefFixture(t, false)
	f.apply(100, 0, f.insert(refC, 100, 0, "1", "1"))
	var path string
	if err := f.wh.conn.QueryRowContext(context.Background(), "SELECT path FROM lakeflow.lake_files WHERE source_table = 'public.c'").Scan(&path); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(f.wh.lake.Abs(path)); err != nil {
		t.Fatal(err)
	}
	f.apply(0, 100, f.insert(refP, 100, 0, "1", "5"))
	if got := f.query("SELECT (SELECT count(*) FROM silver.p)::VARCHAR || '/' || (SELECT count(*) FROM lakeflow.deferred)"); got != "1/0" {
		t.Fatalf("silver.p rows/deferred: %s, want 1/0", got)
	}
}
