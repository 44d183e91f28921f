package catalog

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRenderedEntriesLoadBack(t *testing.T) {
	dir := t.TempDir()
	want := &Dataset{Name: "silver.orders", Kind: Silver, Description: `Orders; "quoted" and \\ slashed`, Owner: "commerce",
		Consumers: []string{"finance"}, Cadence: "every batch", Freshness: 90 * time.Minute, Source: "postgres:public.orders",
		DerivedFrom: []string{"kafka:lakeflow.public.orders", "lake.orders"},
		Columns:     []Column{{Name: "id", Type: "BIGINT"}, {Name: "note", Type: "VARCHAR", Description: "free text"}}}
	write(t, dir, FileName(want.Name), string(want.Render()))
	cat, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := cat.Find("silver.orders")
	if got == nil || got.Description != want.Description || got.Freshness != want.Freshness || !slices.Equal(got.DerivedFrom, want.DerivedFrom) ||
		!slices.Equal(got.Columns, want.Columns) || got.Source != want.Source || got.File == "" {
		t.Fatalf("loaded %+v, want %+v", got, want)
	}
}

func TestMalformedEntriesAreRefused(t *testing.T) {
	for body, want := range map[string]string{
		"name = \"silver.x\"\nkind = \"silver\"\nownr = \"a\"\n":              "x.toml:3: unknown key ownr (did you mean owner?)",
		"name = \"silver.x\"\nkind = \"table\"\n":                             "x.toml:2: kind \"table\"",
		"name = \"silver.y\"\nkind = \"silver\"\n":                            "x.toml:1: name silver.y does not match the file name",
		"name = \"silver.x\"\nkind = \"silver\"\nfreshness = \"soon\"\n":      "x.toml:3: freshness \"soon\"",
		"name = \"silver.x\"\nkind = \"silver\"\n[[columns]]\nname = \"a\"\n": "a column needs a name and a type",
	} {
		dir := t.TempDir()
		write(t, dir, "silver.x.toml", body)
		_, err := Load(dir)
		if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), "silver.x.toml", "x.toml"), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}

// TestTheDemoCatalogAndItsLineage: the catalog shipped for the demo
// loads, every entry has an owner and a description, its lineage names
// every dataset, and docs/check-and-catalog.md shows that very graph.
func TestTheDemoCatalogAndItsLineage(t *testing.T) {
	cat, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(cat) < 20 {
		t.Fatalf("the demo catalog has %d entries", len(cat))
	}
	graph := cat.Mermaid()
	for _, d := range cat {
		if d.Owner == "" || d.Description == "" || d.Cadence == "" {
			t.Errorf("%s lacks an owner, a description or a cadence", d.Name)
		}
		if !strings.Contains(graph, `"`+d.Name+`"`) || !strings.Contains(cat.DOT(), `"`+d.Name+`"`) {
			t.Errorf("the lineage does not name %s", d.Name)
		}
	}
	readme, err := os.ReadFile("../docs/check-and-catalog.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```mermaid\n(.*?)```").FindSubmatch(readme)
	if block == nil || string(block[1]) != graph {
		t.Error("docs/check-and-catalog.md's lineage graph is not lakeflow catalog --lineage of the demo catalog: paste it again")
	}
}
