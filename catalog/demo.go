package catalog

import "embed"

// Demo holds the demo's catalog entries, which lakeflow run --demo writes
// to a project that has none.
//
//go:embed *.toml
var Demo embed.FS
