package gold

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// FuzzMartHeader: any text of a mart file is a mart or an error naming
// the file and a line of it; a mart read has a grain, a SELECT for each
// table it is touched by, and no touched by lines if it is rebuilt whole.
func FuzzMartHeader(f *testing.F) {
	files, err := Demo.ReadDir(".")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range files {
		text, err := Demo.ReadFile(e.Name())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(strings.TrimSuffix(e.Name(), ".sql"), string(text))
	}
	f.Add("m", "-- grain: full\n-- touched by silver.a: x\nSELECT 1")
	f.Add("m", "--grain:\n-- touched by orders: x\n-- touched by silver.: x\n")
	f.Add("9m", "-- grain: d\n")
	located := regexp.MustCompile(`^m\.sql:(\d+): `)
	f.Fuzz(func(t *testing.T, name, text string) {
		m, err := parse("m.sql", name, text)
		if err != nil {
			at := located.FindStringSubmatch(err.Error())
			if at == nil {
				t.Fatalf("error %q does not name the file and line", err)
			}
			if line, _ := strconv.Atoi(at[1]); line < 1 || line > strings.Count(text, "\n")+1 {
				t.Fatalf("error %q names a line the file does not have", err)
			}
			return
		}
		if !validName(name) || m.Name != name || m.SQL != text || m.Grain == "" || strings.TrimSpace(m.Grain) != m.Grain {
			t.Fatalf("parse(%q) = %+v", text, m)
		}
		if m.Grain == Full && len(m.Touched) > 0 {
			t.Fatalf("a mart rebuilt whole has touched by lines: %+v", m)
		}
		for table, sel := range m.Touched {
			if table == "" || !strings.HasPrefix(strings.ToUpper(sel), "SELECT") || m.TouchedLine[table] < 1 {
				t.Fatalf("touched by %q: %q at line %d", table, sel, m.TouchedLine[table])
			}
		}
	})
}
