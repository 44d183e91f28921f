package report

import (
	"fmt"
	"html"
	"html/template"
	"maps"
	"slices"
	"strings"

	"github.com/lakeflow/lakeflow/catalog"
)

// kindColors fill the lineage's nodes by kind.
var kindColors = map[string]string{
	"source": "#dbeafe", "topic": "#e0e7ff", "lake": "#fde68a", "silver": "#e5e7eb",
	"history": "#d1d5db", "gold": "#fcd34d", "operations": "#f3f4f6", "missing": "#fecaca",
}

// lineageSVG draws the catalog's lineage left to right: each node in the
// column of its longest path from a source, steps as curves. Datasets
// no step reaches or leaves (lakeflow's own tables) are left out.
func lineageSVG(c catalog.Catalog) template.HTML {
	kinds, steps := c.Lineage()
	if len(steps) == 0 {
		return ""
	}
	into := map[string][]string{}
	linked := map[string]bool{}
	for _, s := range steps {
		into[s.To] = append(into[s.To], s.From)
		linked[s.From], linked[s.To] = true, true
	}
	rank := map[string]int{}
	var rankOf func(n string, seen map[string]bool) int
	rankOf = func(n string, seen map[string]bool) int {
		if r, ok := rank[n]; ok {
			return r
		}
		if seen[n] {
			return 0 // a cycle (a catalog's mistake): drawn, not followed
		}
		seen[n] = true
		r := 0
		for _, f := range into[n] {
			r = max(r, rankOf(f, seen)+1)
		}
		rank[n] = r
		return r
	}
	columns := map[int][]string{}
	last := 0
	names := slices.Sorted(maps.Keys(linked))
	for _, n := range names {
		r := rankOf(n, map[string]bool{})
		columns[r] = append(columns[r], n)
		last = max(last, r)
	}
	const colW, nodeW, rowH, nodeH, pad = 250, 220, 30, 22, 10
	rows := 0
	at := map[string][2]int{}
	for r := 0; r <= last; r++ {
		rows = max(rows, len(columns[r]))
		for i, n := range columns[r] {
			at[n] = [2]int{pad + r*colW, pad + i*rowH}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="lineage" width="%d" height="%d" font-family="sans-serif" font-size="11">`,
		pad*2+last*colW+nodeW, pad*2+rows*rowH)
	for _, s := range steps {
		f, t := at[s.From], at[s.To]
		x1, y1, x2, y2 := f[0]+nodeW, f[1]+nodeH/2, t[0], t[1]+nodeH/2
		fmt.Fprintf(&b, `<path d="M%d %d C%d %d %d %d %d %d" fill="none" stroke="#6b7280" stroke-width="1"/>`, x1, y1, (x1+x2)/2, y1, (x1+x2)/2, y2, x2, y2)
	}
	for _, n := range names {
		p := at[n]
		fmt.Fprintf(&b, `<g><rect x="%d" y="%d" width="%d" height="%d" rx="4" fill="%s" stroke="#374151"/><text x="%d" y="%d">%s</text><title>%s (%s)</title></g>`,
			p[0], p[1], nodeW, nodeH, kindColors[kinds[n]], p[0]+6, p[1]+15, html.EscapeString(n), html.EscapeString(n), kinds[n])
	}
	b.WriteString("</svg>")
	return template.HTML(b.String())
}
