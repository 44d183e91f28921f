package contracts

import "embed"

// Demo holds the demo's contracts, one per table of its schema, which
// lakeflow run --demo writes to a project that has none.
//
//go:embed *.toml
var Demo embed.FS
