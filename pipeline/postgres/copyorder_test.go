package postgres

import (
	"slices"
	"testing"

	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
)

// TestReferencedTablesAreCopiedFirst: a table an existence rule points to
// is copied before the tables that point to it, whatever order
// source.tables gives; a copy under way keeps its place.
func TestReferencedTablesAreCopiedFirst(t *testing.T) {
	refers := func(to ...string) *contracts.Contract {
		c := &contracts.Contract{}
		for _, name := range to {
			c.Rules = append(c.Rules, contracts.Rule{References: &contracts.Reference{Table: config.Table{Schema: "public", Name: name}}})
		}
		return c
	}
	s := &Source{cfg: SourceConfig{Contracts: contracts.Set{
		"public.order_items": refers("orders", "products"),
		"public.orders":      refers("customers"),
		"public.payments":    refers("orders"),
	}}}
	copies := []change.TableCopy{{Table: "public.payments", Since: 5}, {Table: "public.order_items"}, {Table: "public.payments"},
		{Table: "public.orders"}, {Table: "public.products"}, {Table: "public.customers"}}
	s.referencedFirst(copies)
	var got []string
	for _, c := range copies {
		got = append(got, c.Table)
	}
	want := []string{"public.payments", "public.products", "public.customers", "public.orders", "public.order_items", "public.payments"}
	if !slices.Equal(got, want) {
		t.Fatalf("copies in the order %v, want %v", got, want)
	}
}
