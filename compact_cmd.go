package main

import (
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
)

func compactCommand() *cli.Command {
	return &cli.Command{
		Name:  "compact",
		Usage: "merge the lake's small files, per table and commit day, into files of lake.compact_target (asof, backfill and readers of lake/ see the same events)",
		Flags: append(commonFlags(),
			&cli.StringFlag{Name: "table", Usage: "only this table (schema.table)"},
			&cli.StringFlag{Name: "before", Usage: "only the commit days before this one, YYYY-MM-DD (default: today, UTC; tomorrow takes today's files so far)"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			cfg, log, err := setup(c)
			if err != nil {
				return err
			}
			before := c.String("before")
			if before == "" {
				before = time.Now().UTC().Format(time.DateOnly)
			}
			st, err := pipeline.Compact(c.Context, cfg, pipeline.CompactOptions{Table: c.String("table"), Before: before}, log)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stdout, "compacted %d table-days: %d files merged into %d", st.Days, st.Replaced, st.Written)
			if st.Removed > 0 {
				fmt.Fprintf(os.Stdout, "; %d old days past lake.compact_grace removed", st.Removed)
			}
			fmt.Fprintln(os.Stdout)
			switch cp := st.Checkpoint; {
			case st.CheckpointErr != nil:
				fmt.Fprintf(os.Stderr, "lakeflow: no state checkpoint written (asof and check replay from the one before, or the lake's start): %s\n", fault.OneLine(st.CheckpointErr.Error()))
			case cp.Written:
				fmt.Fprintf(os.Stdout, "state checkpoint at _cdc_seq %d written: %d events replayed in %.1f s\n", uint64(cp.Seq), cp.Events, cp.Seconds)
			}
			return nil
		},
	}
}
