package catalog

import (
	"fmt"
	"slices"
	"strings"
)

// Problem is a way the catalog does not describe what exists.
type Problem struct {
	Check   string // catalog.entry_missing, catalog.schema_drift, …
	Dataset string
	Message string
	Fix     string
	// Warning: the entry holds a Placeholder where a person's words go;
	// the catalog still describes what exists.
	Warning bool
}

// Placeholder is what lakeflow catalog init writes where only a person
// can say (the owner, a description nothing derives): lakeflow check
// warns of it, where an empty field is an error.
const Placeholder = "(to fill in)"

// Compare checks the documented catalog against the derived one (what
// exists, DeriveCatalog): a dataset without an entry, an entry naming a
// dataset that does not exist, a documented schema that drifted, lineage
// naming a dataset that is neither documented nor a source or topic that
// exists, and an entry without an owner or a description (a warning if
// it holds the Placeholder).
func Compare(documented, derived Catalog) []Problem {
	var out []Problem
	add := func(check, dataset, fix, format string, args ...any) {
		out = append(out, Problem{Check: check, Dataset: dataset, Message: fmt.Sprintf(format, args...), Fix: fix})
	}
	external := map[string]bool{}
	for _, e := range derived.edges() {
		for _, n := range []string{e.from, e.to} {
			if strings.HasPrefix(n, SourcePrefix) || strings.HasPrefix(n, TopicPrefix) {
				external[n] = true
			}
		}
	}
	for _, d := range derived {
		if documented.Find(d.Name) == nil {
			add("catalog.entry_missing", d.Name, "lakeflow catalog init writes it", "%s (%s) has no catalog entry", d.Name, d.Kind)
		}
	}
	for _, e := range documented {
		real := derived.Find(e.Name)
		if real == nil {
			add("catalog.dataset_missing", e.Name, "remove "+e.File+", or correct its name", "%s documents %s, which does not exist", e.File, e.Name)
			continue
		}
		for _, f := range []struct{ key, value string }{{"owner", e.Owner}, {"description", e.Description}} {
			switch f.value {
			case "":
				add("catalog."+f.key+"_missing", e.Name, "set "+f.key+" in "+e.File, "%s has no %s", e.Name, f.key)
			case Placeholder:
				add("catalog."+f.key+"_placeholder", e.Name, "set "+f.key+" in "+e.File, "%s's %s is still the placeholder %q", e.Name, f.key, Placeholder)
				out[len(out)-1].Warning = true
			}
		}
		if drift := columnDrift(e.Columns, real.Columns); drift != "" {
			add("catalog.schema_drift", e.Name, "correct the [[columns]] of "+e.File+" (lakeflow catalog init writes the real ones into an empty catalog.dir)",
				"%s documents a schema that is not the real one: %s", e.Name, drift)
		}
		for _, from := range e.DerivedFrom {
			if documented.Find(from) == nil && !external[from] {
				add("catalog.lineage_missing", e.Name, "correct derived_from in "+e.File, "%s is derived from %s, which is neither documented nor a captured table or topic", e.Name, from)
			}
		}
	}
	return out
}

// columnDrift describes how the documented columns differ from the real
// ones ("" if they do not): missing, extra, or of another type.
func columnDrift(doc, real []Column) string {
	var diffs []string
	typeOf := func(cols []Column, name string) (string, bool) {
		i := slices.IndexFunc(cols, func(c Column) bool { return c.Name == name })
		if i < 0 {
			return "", false
		}
		return cols[i].Type, true
	}
	for _, c := range real {
		t, ok := typeOf(doc, c.Name)
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("column %s (%s) is not documented", c.Name, c.Type))
		case !strings.EqualFold(t, c.Type):
			diffs = append(diffs, fmt.Sprintf("column %s is %s, documented as %s", c.Name, c.Type, t))
		}
	}
	for _, c := range doc {
		if _, ok := typeOf(real, c.Name); !ok {
			diffs = append(diffs, fmt.Sprintf("documented column %s does not exist", c.Name))
		}
	}
	return strings.Join(diffs, "; ")
}
