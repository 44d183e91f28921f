package contracts

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoContractsLoad: the contracts the project ships are valid and
// hold the rules DESIGN.md requires.
func TestDemoContractsLoad(t *testing.T) {
	set, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range set {
		for _, r := range c.Rules {
			names = append(names, r.Name)
		}
	}
	for _, want := range []string{"orders.total_non_negative", "orders.status_in_domain", "orders.customer_exists",
		"order_items.quantity_positive", "payments.amount_positive", "customers.email_format", "orders.customer_id_not_null"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("rule %s missing (have %v)", want, names)
		}
	}
	if strings.Contains(strings.Join(names, " "), "orders.id_not_null") {
		t.Errorf("a key column has a not-null rule: %v", names)
	}
	if c := set.For("public", "customers"); c == nil || !c.History || c.Compatibility != Backward {
		t.Errorf("customers: want history and backward compatibility, got %+v", c)
	}
}

// TestMalformedContractsAreRefused: each mistake is named with file and
// line.
func TestMalformedContractsAreRefused(t *testing.T) {
	const head = "table = \"public.t\"\nkey = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integer\"\n[[columns]]\nname = \"v\"\ntype = \"numeric(10,2)\"\n"
	for name, tc := range map[string]struct{ body, want string }{
		"unknown column": {head + "[[rules]]\nname = \"r\"\ncheck = \"w > 0\"\n", `t.toml:9: rule t.r: check "w > 0": Binder Error: Referenced column "w" not found in FROM clause!`},
		"bad type":       {"table = \"public.t\"\nkey = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integr\"\n", `t.toml:3: column id: type "integr" is not built in`},
		"duplicate rule": {head + "[[rules]]\nname = \"r\"\ncheck = \"v > 0\"\n[[rules]]\nname = \"r\"\ncheck = \"v < 9\"\n", "t.toml:12: rule t.r is declared twice"},
		"not parsing":    {head + "[[rules]]\nname = \"r\"\ncheck = \"v >\"\n", "does not parse"},
		"not boolean":    {head + "[[rules]]\nname = \"r\"\ncheck = \"v + 1\"\n", "not a condition"},
		"subquery":       {head + "[[rules]]\nname = \"r\"\ncheck = \"v IN (SELECT 1)\"\n", "subquery is not allowed"},
		"statement":      {head + "[[rules]]\nname = \"r\"\ncheck = \"true; DROP TABLE x\"\n", "not one expression"},
		"side effect":    {head + "[[rules]]\nname = \"r\"\ncheck = \"random() < v\"\n", "random() is not allowed"},
		"aggregate":      {head + "[[rules]]\nname = \"r\"\ncheck = \"sum(v) > 0\"\n", "aggregate sum() is not allowed"},
		"bad action":     {head + "[[rules]]\nname = \"r\"\ncheck = \"v > 0\"\naction = \"drop\"\n", "action \"drop\""},
		"unknown key":    {head + "[[rules]]\nname = \"r\"\nchek = \"v > 0\"\n", "t.toml:11: unknown key rules.chek (did you mean rules.check?)"},
		"wrong type":     {"table = \"public.t\"\nkey = \"id\"\n", "t.toml:2: key: a TOML string where a list of strings is wanted"},
		"renamed twice":  {head + "[[columns]]\nname = \"w\"\ntype = \"integer\"\nrenamed_from = \"u\"\n[[columns]]\nname = \"x\"\ntype = \"integer\"\nrenamed_from = \"U\"\n", `t.toml:13: columns w and x are both renamed_from "U"`},
		"missing target": {head + "[[rules]]\nname = \"r\"\nreferences = \"public.u\"\non = { id = \"id\" }\n", "references public.u, which has no contract"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "t.toml"), []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want an error containing %q, got %v", name, tc.want, err)
		}
		if err != nil && strings.Contains(err.Error(), "DESCRIBE") {
			t.Errorf("%s: the error shows lakeflow's own SQL: %v", name, err)
		}
	}
}

// FuzzContract: any contract file is a contract or an error that starts
// with the file's name; a contract read has a table, a key among its
// columns and named rules.
func FuzzContract(f *testing.F) {
	demo, err := filepath.Glob("*.toml")
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range demo {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("table = \"public.t\"\nkey = [\"id\"]\n[[columns]]\nname = \"id\"\ntype = \"integer\"\nnullable = false\n" +
		"[[rules]]\nname = \"r\"\ncheck = \"id > 0\"\n[[checks]]\nname = \"c\"\nsql = \"SELECT 1\"\n"))
	ck, err := newChecker()
	if err != nil {
		f.Fatal(err)
	}
	defer ck.close()
	path := filepath.Join(f.TempDir(), "t.toml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := loadFile(path, ck)
		if err != nil {
			if !strings.HasPrefix(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if c.Table.Name == "" || len(c.Key) == 0 || len(c.Columns) == 0 {
			t.Fatalf("contract %+v taken without a table, key or columns", c)
		}
		for _, k := range c.Key {
			if c.Column(k) == nil {
				t.Fatalf("key %s is not a column of %+v", k, c)
			}
		}
		for _, r := range c.Rules {
			if r.Name == "" || r.Check == "" && r.References == nil {
				t.Fatalf("a rule without a name or a condition: %+v", r)
			}
		}
	})
}
