package catalog

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// nodeID turns a lineage node's name into a Mermaid node id.
var nodeID = regexp.MustCompile(`[^A-Za-z0-9]+`)

// edge is one lineage step: from is derived into to.
type edge struct{ from, to string }

// edges are the catalog's lineage steps, sorted: each entry's
// derived_from, and, for a lake table, its source table into the topic it
// is read from.
func (c Catalog) edges() []edge {
	var out []edge
	for _, d := range c {
		for _, f := range d.DerivedFrom {
			out = append(out, edge{f, d.Name})
			if d.Kind == Lake && d.Source != "" && strings.HasPrefix(f, TopicPrefix) {
				out = append(out, edge{d.Source, f})
			}
		}
	}
	slices.SortFunc(out, func(a, b edge) int { return strings.Compare(a.from+"\x00"+a.to, b.from+"\x00"+b.to) })
	return slices.Compact(out)
}

// nodes are every name the lineage draws, sorted.
func (c Catalog) nodes() []string {
	var out []string
	for _, d := range c {
		out = append(out, d.Name)
	}
	for _, e := range c.edges() {
		out = append(out, e.from, e.to)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// kindOf is the kind of a lineage node: a dataset's, or source / topic.
func (c Catalog) kindOf(name string) string {
	if d := c.Find(name); d != nil {
		return string(d.Kind)
	}
	switch {
	case strings.HasPrefix(name, SourcePrefix):
		return "source"
	case strings.HasPrefix(name, TopicPrefix):
		return "topic"
	}
	return "missing"
}

// Mermaid draws the lineage as a Mermaid flowchart, left to right,
// nodes styled by kind.
func (c Catalog) Mermaid() string {
	var b strings.Builder
	b.WriteString("flowchart LR\n")
	ids := map[string]string{}
	for _, n := range c.nodes() {
		ids[n] = nodeID.ReplaceAllString(n, "_")
		open, close := "[", "]"
		switch c.kindOf(n) {
		case "source":
			open, close = "[(", ")]"
		case "topic":
			open, close = "[[", "]]"
		case "gold":
			open, close = "([", "])"
		}
		fmt.Fprintf(&b, "  %s%s\"%s\"%s:::%s\n", ids[n], open, n, close, c.kindOf(n))
	}
	for _, e := range c.edges() {
		fmt.Fprintf(&b, "  %s --> %s\n", ids[e.from], ids[e.to])
	}
	for _, k := range []string{"source", "topic", "lake", "silver", "history", "gold", "operations", "missing"} {
		fmt.Fprintf(&b, "  classDef %s %s\n", k, mermaidStyle[k])
	}
	return b.String()
}

var mermaidStyle = map[string]string{
	"source":     "fill:#e8eaf6,stroke:#3949ab",
	"topic":      "fill:#fff3e0,stroke:#ef6c00",
	"lake":       "fill:#efebe9,stroke:#6d4c41",
	"silver":     "fill:#eceff1,stroke:#546e7a",
	"history":    "fill:#eceff1,stroke:#546e7a,stroke-dasharray:3",
	"gold":       "fill:#fff8e1,stroke:#f9a825",
	"operations": "fill:#f1f8e9,stroke:#558b2f",
	"missing":    "fill:#ffebee,stroke:#c62828",
}

// DOT draws the lineage for Graphviz.
func (c Catalog) DOT() string {
	var b strings.Builder
	b.WriteString("digraph lineage {\n  rankdir=LR;\n  node [fontname=\"Helvetica\"];\n")
	shape := map[string]string{"source": "cylinder", "topic": "cds", "gold": "box3d", "missing": "octagon"}
	for _, n := range c.nodes() {
		s := shape[c.kindOf(n)]
		if s == "" {
			s = "box"
		}
		fmt.Fprintf(&b, "  %q [shape=%s, tooltip=%q];\n", n, s, c.kindOf(n))
	}
	for _, e := range c.edges() {
		fmt.Fprintf(&b, "  %q -> %q;\n", e.from, e.to)
	}
	b.WriteString("}\n")
	return b.String()
}

// A Step is one lineage step: From is derived into To.
type Step struct{ From, To string }

// Lineage returns what the lineage draws: every node with its kind
// (a dataset's, or source / topic), and the steps between them, sorted.
func (c Catalog) Lineage() (kinds map[string]string, steps []Step) {
	kinds = map[string]string{}
	for _, n := range c.nodes() {
		kinds[n] = c.kindOf(n)
	}
	for _, e := range c.edges() {
		steps = append(steps, Step{e.from, e.to})
	}
	return kinds, steps
}
