package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/config"
)

// TestTheManualMatchesTheCLI: every command, flag and config key lakeflow
// knows is documented in docs/, and every one docs/ and the README name
// is real (a command, a flag of the command it goes with, a key of
// lakeflow.toml).
func TestTheManualMatchesTheCLI(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil || len(pages) < 8 {
		t.Fatalf("docs/: %v %v", pages, err)
	}
	read := func(files ...string) string {
		var b strings.Builder
		for _, p := range files {
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(data)
			b.WriteByte('\n')
		}
		return b.String()
	}
	text := read(pages...)
	code := regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(text+read("README.md"), -1)

	// What the CLI knows: commands (with their subcommands) and their flags.
	app := newApp()
	flags := map[string][]string{} // command path → its flags
	common := names(app.Flags)
	var walk func(prefix string, cmds []*cli.Command)
	walk = func(prefix string, cmds []*cli.Command) {
		for _, c := range cmds {
			path := strings.TrimSpace(prefix + " " + c.Name)
			flags[path] = names(c.Flags)
			walk(path, c.Subcommands)
		}
	}
	walk("", app.Commands)
	for path, fs := range flags {
		if !strings.Contains(text, "`lakeflow "+path) {
			t.Errorf("lakeflow %s is not documented in docs/ (as `lakeflow %s …`)", path, path)
		}
		for _, f := range fs {
			if !slices.Contains(common, f) && !regexp.MustCompile("`lakeflow "+regexp.QuoteMeta(path)+"[^`]*--"+regexp.QuoteMeta(f)+`\b`).MatchString(text) {
				t.Errorf("lakeflow %s --%s is not documented in docs/", path, f)
			}
		}
	}
	// What the manual names: `lakeflow <command> … --flag …`.
	invocation := regexp.MustCompile(`^lakeflow ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?`)
	flag := regexp.MustCompile(`(?:^|\s|\[)--([a-z][a-z-]*)`)
	for _, m := range code {
		span := m[1]
		inv := invocation.FindStringSubmatch(span)
		if inv == nil {
			continue
		}
		path := inv[1]
		if _, ok := flags[path]; !ok {
			t.Errorf("the manual names `%s`: lakeflow has no command %s", span, path)
			continue
		}
		if _, ok := flags[path+" "+inv[2]]; inv[2] != "" && ok {
			path += " " + inv[2]
		}
		for _, f := range flag.FindAllStringSubmatch(strings.SplitN(span, " -- ", 2)[0], -1) {
			if !slices.Contains(flags[path], f[1]) && !slices.Contains(common, f[1]) && f[1] != "help" && f[1] != "version" {
				t.Errorf("the manual names `%s`: lakeflow %s has no flag --%s", span, path, f[1])
			}
		}
	}

	// Config keys: each in docs/configuration.md's table, and each key
	// that table names real.
	data, err := os.ReadFile("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	keys := config.Keys()
	var documented []string
	for _, line := range strings.Split(string(data), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(line, "| `") {
			continue
		}
		for _, k := range regexp.MustCompile("`([a-z_.<>]+)`").FindAllStringSubmatch(cells[1], -1) {
			key, _, _ := strings.Cut(k[1], ".<") // gold.refresh.<mart>
			documented = append(documented, key)
			if !slices.Contains(keys, key) {
				t.Errorf("docs/configuration.md documents %s, which lakeflow.toml does not take", k[1])
			}
		}
	}
	for _, k := range keys {
		if !slices.Contains(documented, k) {
			t.Errorf("config key %s is not in docs/configuration.md's table", k)
		}
	}
}

// names are the flags' names.
func names(flags []cli.Flag) []string {
	var out []string
	for _, f := range flags {
		out = append(out, f.Names()...)
	}
	return out
}
