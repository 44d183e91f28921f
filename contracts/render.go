package contracts

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
)

// Draft is what the live source says of a table: the start of a contract.
type Draft struct {
	Table   config.Table
	Key     []string
	Columns []Column
}

// Schema is the draft's table as lakeflow types it.
func (d Draft) Schema() (*change.Table, error) {
	t := &change.Table{Schema: d.Table.Schema, Name: d.Table.Name}
	for _, c := range d.Columns {
		typ, err := ParseType(c.Type, c.Base)
		if err != nil {
			return nil, fmt.Errorf("%s column %s: %v", d.Table, c.Name, err)
		}
		t.Columns = append(t.Columns, change.Column{Name: c.Name, Type: typ, Key: slices.Contains(d.Key, c.Name)})
	}
	return t, nil
}

// FileName is where a table's contract lives in contracts.dir.
func FileName(t config.Table) string {
	name := t.Name
	if t.Schema != "public" {
		name = t.Schema + "." + name
	}
	var b strings.Builder
	for _, r := range name {
		if r == '/' || r == '\\' || r < ' ' {
			r = '_'
		}
		b.WriteRune(r)
	}
	return b.String() + ".toml"
}

// Render writes a draft as a contract file: the columns and key as the
// source has them, the rest for the owner to fill in.
func Render(d Draft) []byte {
	var b bytes.Buffer
	q := strconv.Quote
	fmt.Fprintf(&b, "# The data contract of %s, written by lakeflow contracts init from the\n", d.Table)
	fmt.Fprintf(&b, "# live source. Fill in owner, consumers, description and freshness; add\n")
	fmt.Fprintf(&b, "# [[rules]] (name, check = \"<SQL condition over one row>\", action =\n")
	fmt.Fprintf(&b, "# \"quarantine\" | \"warn\" | \"fail\"); see docs/contracts.md.\n")
	fmt.Fprintf(&b, "table = %s\n", q(d.Table.String()))
	fmt.Fprintf(&b, "owner = \"\"\nconsumers = []\ndescription = \"\"\n# freshness = \"15m\"\n")
	fmt.Fprintf(&b, "compatibility = \"backward\"\nhistory = false\n")
	keys := make([]string, len(d.Key))
	for i, k := range d.Key {
		keys[i] = q(k)
	}
	fmt.Fprintf(&b, "key = [%s]\n", strings.Join(keys, ", "))
	for _, c := range d.Columns {
		fmt.Fprintf(&b, "\n[[columns]]\nname = %s\ntype = %s\n", q(c.Name), q(c.Type))
		if c.Base != "" {
			fmt.Fprintf(&b, "base = %s\n", q(c.Base))
		}
		fmt.Fprintf(&b, "nullable = %t\n", c.Nullable)
	}
	return b.Bytes()
}
