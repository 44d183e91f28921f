package main

import (
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
)

func backfillCommand() *cli.Command {
	return &cli.Command{
		Name:  "backfill",
		Usage: "rebuild from the lake through the stream's transforms: --all (the whole warehouse), or --from DAY --to DAY (what those days changed)",
		Flags: append(commonFlags(),
			&cli.BoolFlag{Name: "all", Usage: "rebuild the whole warehouse from the lake (a lost warehouse comes back this way)"},
			&cli.StringFlag{Name: "from", Usage: "first day (YYYY-MM-DD, the lake's commit days)"},
			&cli.StringFlag{Name: "to", Usage: "last day (YYYY-MM-DD, inclusive)"},
			&cli.StringFlag{Name: "mart", Usage: "with --from/--to: recompute only this gold mart's partitions, from silver"},
			&cli.StringFlag{Name: "out", Usage: "with --all: write the rebuilt warehouse to this file instead of replacing warehouse.path"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			opts := pipeline.BackfillOptions{All: c.Bool("all"), Mart: c.String("mart"), Out: c.String("out")}
			var err error
			switch {
			case c.NArg() > 0:
				return fmt.Errorf("%w: backfill takes no arguments (got %q)", fault.ErrConfig, c.Args().First())
			case opts.All && (c.IsSet("from") || c.IsSet("to") || c.IsSet("mart")):
				return fmt.Errorf("%w: --all rebuilds everything: it takes no --from, --to or --mart", fault.ErrConfig)
			case !opts.All && c.IsSet("out"):
				return fmt.Errorf("%w: --out goes with --all", fault.ErrConfig)
			case !opts.All:
				if opts.From, err = day(c, "from"); err != nil {
					return err
				}
				if opts.To, err = day(c, "to"); err != nil {
					return err
				}
				if opts.To.Before(opts.From) {
					return fmt.Errorf("%w: --to %s is before --from %s", fault.ErrConfig, c.String("to"), c.String("from"))
				}
			}
			cfg, log, err := setup(c)
			if err != nil {
				return err
			}
			st, err := pipeline.Backfill(c.Context, cfg, opts, log)
			if err != nil {
				return err
			}
			if line := backfillSummary(opts, st); line != "" {
				fmt.Fprintln(os.Stdout, line)
			}
			return nil
		},
	}
}

// backfillSummary is the line a backfill prints: what it rebuilt or
// replaced ("" when the lake held nothing of the days: a warning said so).
func backfillSummary(opts pipeline.BackfillOptions, st pipeline.BackfillStats) string {
	days := opts.From.Format(time.DateOnly) + " to " + opts.To.Format(time.DateOnly)
	switch {
	case opts.All:
		return fmt.Sprintf("rebuilt %s from the lake: %d events in %.2f s (%.0f events/s), %d quarantined, %d lake files adopted",
			st.Path, st.Events, st.Seconds, float64(st.Events)/max(st.Seconds, 1e-9), st.Quarantined, st.Adopted)
	case opts.Mart != "":
		return fmt.Sprintf("recomputed gold.%s for %s in %s in %.2f s", opts.Mart, days, st.Path, st.Seconds)
	case st.Empty:
		return ""
	}
	unpublished := ""
	if st.Unpublished {
		unpublished = "; the live warehouse ends inside a source transaction, so warehouse.path keeps its copy until the next lakeflow run completes it"
	}
	replayed := fmt.Sprintf("the lake's %d events replayed whole", st.Events)
	if st.From != 0 {
		replayed = fmt.Sprintf("the lake's state checkpoint at _cdc_seq %d and the %d events after it replayed", uint64(st.From), st.Events)
	}
	return fmt.Sprintf("backfilled %s in %s: %d keys' silver rows replaced (and their history), %d marts recomputed, in %.2f s (%s)%s",
		days, st.Path, st.Slice.Keys, st.Slice.Marts, st.Seconds, replayed, unpublished)
}

// day parses a --from or --to flag.
func day(c *cli.Context, name string) (time.Time, error) {
	if !c.IsSet(name) {
		return time.Time{}, fmt.Errorf("%w: give --all, or --from and --to (YYYY-MM-DD)", fault.ErrConfig)
	}
	d, err := time.Parse(time.DateOnly, c.String(name))
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: --%s %q: want a day like 2024-02-29", fault.ErrConfig, name, c.String(name))
	}
	return d, nil
}
