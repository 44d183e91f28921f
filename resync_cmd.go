package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/pipeline"
)

func resyncCommand() *cli.Command {
	return &cli.Command{
		Name:      "resync",
		Usage:     "copy tables again while the others stream, and delete in silver the rows gone from the source (after a table rewrite, a restored backup, a lost slot)",
		ArgsUsage: "TABLE…",
		Flags: append(commonFlags(),
			&cli.BoolFlag{Name: "all", Usage: "every captured table; with a lost replication slot, lakeflow run makes it again"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			cfg, _, err := setupQuiet(c)
			if err != nil {
				return err
			}
			tables, running, err := pipeline.RequestResync(cfg, c.Args().Slice(), c.Bool("all"))
			if err != nil {
				return err
			}
			what := "every captured table"
			if len(tables) > 0 {
				what = strings.Join(tables, ", ")
			}
			if running {
				fmt.Fprintf(os.Stdout, "resync of %s requested: the running pipeline starts it within a second (lakeflow status shows its progress)\n", what)
			} else {
				fmt.Fprintf(os.Stdout, "resync of %s requested: the next lakeflow run does it\n", what)
			}
			return nil
		},
	}
}
