package main

import (
	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/pipeline"
)

func psqlCommand() *cli.Command {
	return &cli.Command{
		Name: "psql",
		Usage: "open psql on the source: source.dsn, or the embedded PostgreSQL (started for the session when no lakeflow run holds the data directory, " +
			"and stopped after); psql's own arguments go after --",
		ArgsUsage:    "[-- psql arguments]",
		Flags:        commonFlags(),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			cfg, log, err := setupQuiet(c)
			if err != nil {
				return err
			}
			return pipeline.Psql(c.Context, cfg, c.Args().Slice(), log)
		},
	}
}
