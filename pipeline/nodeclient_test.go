package pipeline

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// nodeReader is a script for Node.js's DuckDB client (@duckdb/node-api,
// the one the README names): it opens a database read-only and prints a
// query's rows as JSON.
const nodeReader = `const { DuckDBInstance } = require('@duckdb/node-api');
(async () => {
	const db = await DuckDBInstance.create(process.argv[2], { access_mode: 'READ_ONLY' });
	const rows = await (await db.connect()).runAndReadAll(process.argv[3]);
	console.log(JSON.stringify(rows.getRowsJson()));
})().catch((e) => { console.error(String(e)); process.exit(1); });
`

// nodeQuery runs query on the DuckDB file at path with Node.js's DuckDB
// client, in a process of its own, and returns its rows as JSON.
func nodeQuery(t *testing.T, path, query string) string {
	t.Helper()
	modules := os.Getenv("DUCKDB_NODE_MODULES")
	if modules == "" {
		t.Fatal("DUCKDB_NODE_MODULES is not set: run the tests with scripts/test, which installs @duckdb/node-api")
	}
	script := filepath.Join(t.TempDir(), "read.cjs")
	if err := os.WriteFile(script, []byte(nodeReader), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", script, path, query)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node's DuckDB client on %s: %v\n%s", path, err, out)
	}
	return strings.TrimSpace(string(out))
}
