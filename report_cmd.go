package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
)

func reportCommand() *cli.Command {
	return &cli.Command{
		Name:  "report",
		Usage: "write one self-contained HTML page of the pipeline's state: throughput and freshness over time, datasets against their SLAs, lake files, quarantine, dead letters, the last check, schema history, lineage, gold marts",
		Flags: append(commonFlags(),
			&cli.StringFlag{Name: "out", Value: "report.html", Usage: "the HTML file to write"},
			&cli.StringFlag{Name: "since", Value: "7d", Usage: "how far back the charts over time go (Nd, or a duration such as 12h)"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("%w: report takes no arguments (got %q)", fault.ErrConfig, c.Args().First())
			}
			since, err := parseSince(c.String("since"))
			if err != nil {
				return err
			}
			cfg, log, err := setupQuiet(c)
			if err != nil {
				return err
			}
			if err := pipeline.Report(c.Context, cfg, c.String("out"), since, log); err != nil {
				return err
			}
			fmt.Fprintf(os.Stdout, "wrote %s: open it in a browser (it fetches nothing)\n", c.String("out"))
			return nil
		},
	}
}

// parseSince reads --since: days (7d) or a Go duration (12h, 90m).
func parseSince(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n > 0 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return d, nil
	}
	return 0, fmt.Errorf("%w: --since %q: want days (7d) or a duration (12h)", fault.ErrConfig, s)
}
