// Package catalog is the dataset catalog: one TOML file per dataset in
// catalog.dir (every lake table, silver table, history table, gold mart
// and operations table), saying what it holds, who owns and uses it, how
// often it changes and how fresh it must be, its columns, and what it is
// derived from. The files are reviewed like code; `lakeflow catalog init`
// writes what can be derived, so nobody types a schema by hand. This
// package loads, writes and draws them.
package catalog

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// Kind is a dataset's layer.
type Kind string

// The kinds of datasets.
const (
	Lake       Kind = "lake"       // bronze: every event, Parquet, lake/<table>/
	Silver     Kind = "silver"     // the source table, one row per key
	History    Kind = "history"    // SCD2 versions of a silver table
	Gold       Kind = "gold"       // a mart, from silver by SQL
	Operations Kind = "operations" // lakeflow's own tables
)

var kinds = []Kind{Lake, Silver, History, Gold, Operations}

// External lineage nodes are named with a scheme: the captured source
// table and the Kafka topic events travel through.
const (
	SourcePrefix = "postgres:"
	TopicPrefix  = "kafka:"
)

// Dataset is one catalog entry.
type Dataset struct {
	// File is the entry's path ("" for one not written yet).
	File string `toml:"-"`
	// Name is how it is queried: lake.orders (read_parquet of
	// lake/orders/), silver.orders, gold.daily_revenue, lakeflow.batches.
	Name        string        `toml:"name"`
	Kind        Kind          `toml:"kind"`
	Description string        `toml:"description"`
	Owner       string        `toml:"owner"`
	Consumers   []string      `toml:"consumers"`
	Cadence     string        `toml:"cadence"`
	Freshness   time.Duration `toml:"-"`
	// Source is the captured table the dataset comes from, if one.
	Source string `toml:"source,omitempty"`
	// DerivedFrom names the datasets (or postgres:/kafka: nodes) it is
	// computed from.
	DerivedFrom []string `toml:"derived_from"`
	Columns     []Column `toml:"columns"`
}

// Column is a documented column: its name and DuckDB type.
type Column struct {
	Name        string `toml:"name" json:"name"`
	Type        string `toml:"type" json:"type"`
	Description string `toml:"description,omitempty" json:"description,omitempty"`
}

// entryFile mirrors an entry's file.
type entryFile struct {
	Dataset
	Freshness string `toml:"freshness"`
}

// Catalog is the loaded entries, by name.
type Catalog []*Dataset

// Find returns the entry named name, or nil.
func (c Catalog) Find(name string) *Dataset {
	for _, d := range c {
		if d.Name == name {
			return d
		}
	}
	return nil
}

// FileName is the file an entry is kept in, in the catalog's directory.
func FileName(name string) string { return name + ".toml" }

// Load reads every *.toml file of dir (a missing dir is an empty
// catalog). Every problem of form is reported with its file and line; an
// entry without an owner or a description loads (lakeflow check reports
// it).
func Load(dir string) (Catalog, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.toml"))
	if err != nil {
		return nil, fmt.Errorf("%w: catalog.dir %s: %v", fault.ErrConfig, dir, err)
	}
	slices.Sort(paths)
	var out Catalog
	var problems []string
	for _, p := range paths {
		d, err := loadFile(p)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if prev := out.Find(d.Name); prev != nil {
			problems = append(problems, fmt.Sprintf("%s: dataset %s already has the entry %s", p, d.Name, prev.File))
			continue
		}
		out = append(out, d)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: catalog: %s", fault.ErrConfig, strings.Join(problems, "; "))
	}
	return out, nil
}

func loadFile(path string) (*Dataset, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f entryFile
	if err := config.DecodeStrict(path, data, &f); err != nil {
		return nil, err
	}
	d := f.Dataset
	d.File = path
	line := func(key string) int {
		for i, s := range strings.Split(string(data), "\n") {
			if k, _, ok := strings.Cut(s, "="); ok && strings.TrimSpace(k) == key {
				return i + 1
			}
		}
		return 1
	}
	var problems []string
	bad := func(key, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: %s", path, line(key), fmt.Sprintf(format, args...)))
	}
	if d.Name == "" {
		bad("name", "name is missing: want the dataset as it is queried, e.g. silver.orders")
	} else if filepath.Base(path) != FileName(d.Name) {
		bad("name", "name %s does not match the file name (want %s)", d.Name, FileName(d.Name))
	}
	if !slices.Contains(kinds, d.Kind) {
		bad("kind", "kind %q: want one of %v", d.Kind, kinds)
	}
	if f.Freshness != "" {
		if d.Freshness, err = time.ParseDuration(f.Freshness); err != nil || d.Freshness <= 0 {
			bad("freshness", "freshness %q is not a duration like \"15m\"", f.Freshness)
		}
	}
	for _, c := range d.Columns {
		if c.Name == "" || c.Type == "" {
			bad("name", "a column needs a name and a type")
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return &d, nil
}

// Render is the entry's file.
func (d *Dataset) Render() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# The catalog entry of %s (%s). Derived by lakeflow catalog init; edit freely.\n", d.Name, d.Kind)
	kv := func(k, v string) { fmt.Fprintf(&b, "%s = %s\n", k, quote(v)) }
	kv("name", d.Name)
	kv("kind", string(d.Kind))
	kv("description", d.Description)
	kv("owner", d.Owner)
	fmt.Fprintf(&b, "consumers = %s\n", list(d.Consumers))
	kv("cadence", d.Cadence)
	if d.Freshness > 0 {
		kv("freshness", ShortDuration(d.Freshness))
	}
	if d.Source != "" {
		kv("source", d.Source)
	}
	fmt.Fprintf(&b, "derived_from = %s\n", list(d.DerivedFrom))
	for _, c := range d.Columns {
		fmt.Fprintf(&b, "\n[[columns]]\nname = %s\ntype = %s\n", quote(c.Name), quote(c.Type))
		if c.Description != "" {
			kv("description", c.Description)
		}
	}
	return []byte(b.String())
}

// ShortDuration writes a duration as people do: 5m, 1h, 1h30m.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`).Replace(s) + `"`
}

func list(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = quote(x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// JSON is the entry as one JSON object.
func (d *Dataset) JSON() string {
	type out struct {
		Name        string   `json:"name"`
		Kind        Kind     `json:"kind"`
		Description string   `json:"description"`
		Owner       string   `json:"owner"`
		Consumers   []string `json:"consumers"`
		Cadence     string   `json:"cadence"`
		Freshness   string   `json:"freshness,omitempty"`
		Source      string   `json:"source,omitempty"`
		DerivedFrom []string `json:"derived_from"`
		Columns     []Column `json:"columns"`
		File        string   `json:"file"`
	}
	o := out{d.Name, d.Kind, d.Description, d.Owner, d.Consumers, d.Cadence, "", d.Source, d.DerivedFrom, d.Columns, d.File}
	if d.Freshness > 0 {
		o.Freshness = ShortDuration(d.Freshness)
	}
	data, _ := json.Marshal(o)
	return string(data)
}
