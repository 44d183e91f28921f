package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/warehouse"
)

func sqlCommand() *cli.Command {
	return &cli.Command{
		Name:      "sql",
		Usage:     "run a query against the published warehouse (warehouse.path: the freshest copy while lakeflow run --follow runs, all of it otherwise)",
		ArgsUsage: `"<query>"`,
		Flags: append(commonFlags(),
			&cli.StringFlag{Name: "format", Value: "text", Usage: "text (aligned), csv, json (one object per line) or markdown"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("%w: sql takes one query, quoted (got %d arguments)", fault.ErrConfig, c.NArg())
			}
			if err := checkFormat(c.String("format")); err != nil {
				return err
			}
			cfg, _, err := setupQuiet(c)
			if err != nil {
				return err
			}
			r, err := warehouse.OpenReader(c.Context, cfg.Warehouse.Path)
			if err != nil {
				return err
			}
			defer r.Close()
			return printQuery(c, r, c.Args().First())
		},
	}
}
