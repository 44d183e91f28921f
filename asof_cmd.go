package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
	"github.com/lakeflow/lakeflow/warehouse"
)

func asofCommand() *cli.Command {
	return &cli.Command{
		Name:      "asof",
		Usage:     "the data as it was at a position of the log, from the lake (runs beside lakeflow run)",
		ArgsUsage: "<position>",
		Description: "A position is " + pipeline.PositionForms + ".\n" +
			"The state is what silver said once every transaction committed at or before the position was applied\n" +
			"(rules and quarantine as the stream applies them). Give one of --table, --query or --out, or --list.",
		Flags: append(commonFlags(),
			&cli.StringFlag{Name: "table", Usage: "print this table as of the position (silver tables by name; also <table>_history and gold.<mart>)"},
			&cli.StringFlag{Name: "where", Usage: "with --table: a SQL condition on its rows"},
			&cli.IntFlag{Name: "limit", Usage: "print at most this many rows (0: all)"},
			&cli.StringFlag{Name: "format", Value: "text", Usage: "text (aligned), csv, json (one object per line) or markdown"},
			&cli.StringFlag{Name: "query", Usage: "run this SQL over the as-of tables (silver.*, silver.*_history, gold.*, lakeflow.quarantine)"},
			&cli.StringFlag{Name: "out", Usage: "write the whole as-of warehouse (silver, history, gold, quarantine) to this new DuckDB file"},
			&cli.BoolFlag{Name: "list", Usage: "list the positions the pipeline recorded (its consistent batches), newest first"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			if err := checkFormat(c.String("format")); err != nil {
				return err
			}
			if c.Int("limit") < 0 {
				return fmt.Errorf("%w: --limit must be 0 (all) or more", fault.ErrConfig)
			}
			if c.Bool("list") {
				if c.NArg() > 0 || c.IsSet("table") || c.IsSet("query") || c.IsSet("out") || c.IsSet("where") {
					return fmt.Errorf("%w: --list takes no position, --table, --where, --query or --out", fault.ErrConfig)
				}
				return listPositions(c)
			}
			given := 0
			for _, f := range []string{"table", "query", "out"} {
				if c.IsSet(f) {
					given++
				}
			}
			switch {
			case c.NArg() != 1:
				return fmt.Errorf("%w: asof takes one position (got %d arguments); it is %s", fault.ErrConfig, c.NArg(), pipeline.PositionForms)
			case given != 1:
				return fmt.Errorf("%w: give one of --table, --query or --out", fault.ErrConfig)
			case c.IsSet("where") && !c.IsSet("table"):
				return fmt.Errorf("%w: --where goes with --table", fault.ErrConfig)
			case c.IsSet("out") && (c.IsSet("limit") || c.IsSet("format")):
				return fmt.Errorf("%w: --out writes a file: it takes no --limit or --format", fault.ErrConfig)
			}
			cfg, log, err := setupQuiet(c)
			if err != nil {
				return err
			}
			a, err := pipeline.BuildAsOf(c.Context, cfg, pipeline.AsOfOptions{Position: c.Args().First(), Table: c.String("table"), Out: c.String("out")}, log)
			if err != nil {
				return err
			}
			defer a.Close()
			if a.After {
				fmt.Fprintf(os.Stderr, "lakeflow: %s is after the lake's last event (%s, committed %s): this is the latest state\n",
					c.Args().First(), a.Last.Seq, a.Last.Commit.Format(time.RFC3339Nano))
			}
			if a.Split {
				fmt.Fprintf(os.Stderr, "lakeflow: the lake's last changes hold part of a transaction whose rest it does not hold yet: this is the state as of %s, the last batch that ended at a transaction boundary\n",
					a.Bound.Seq)
			}
			if a.Held {
				fmt.Fprintf(os.Stderr, "lakeflow: a batch is being published to the lake (or a crash left one half published): this is the state as of %s, the last position the lake holds whole\n",
					a.Bound.Seq)
			}
			log.Info("as-of warehouse built", "checkpoint", uint64(a.From), "files", a.Stats.Files, "bytes", a.Stats.Bytes, "events", a.Stats.Events, "seconds", a.Seconds)
			if c.IsSet("out") {
				from := ""
				if a.From != 0 {
					from = fmt.Sprintf(" after the lake's state checkpoint at _cdc_seq %d", uint64(a.From))
				}
				fmt.Fprintf(os.Stdout, "wrote %s: the warehouse as of %s (%d events%s from %d lake files, %.1f MB, in %.2f s)\n",
					c.String("out"), c.Args().First(), a.Stats.Events, from, a.Stats.Files, float64(a.Stats.Bytes)/1e6, a.Seconds)
				return nil
			}
			q := c.String("query")
			if c.IsSet("table") {
				q = tableQuery(a, c.String("where"))
			}
			if n := c.Int("limit"); n > 0 {
				q = fmt.Sprintf("SELECT * FROM (%s\n) LIMIT %d", warehouse.TrimQuery(q), n)
			}
			return printQuery(c, a, q)
		},
	}
}

// tableQuery is the query printing the table asked for: a silver table's
// live rows by key (soft-deleted rows are gone as of then), any other
// table whole.
func tableQuery(a *pipeline.AsOf, where string) string {
	if !a.Silver {
		q := "SELECT * FROM " + a.Relation
		if where != "" {
			q += " WHERE (" + where + ")"
		}
		return q + " ORDER BY ALL"
	}
	q := "SELECT * EXCLUDE (_deleted) FROM " + a.Relation + " WHERE NOT _deleted"
	if where != "" {
		q += " AND (" + where + ")"
	}
	return q + " ORDER BY " + strings.Join(a.Key, ", ")
}

// listPositions prints the recorded positions.
func listPositions(c *cli.Context) error {
	cfg, log, err := setupQuiet(c)
	if err != nil {
		return err
	}
	n := c.Int("limit")
	if n == 0 {
		n = 20
	}
	bs, err := pipeline.AsOfBatches(c.Context, cfg, n, log)
	if err != nil {
		return err
	}
	if len(bs) == 0 {
		fmt.Fprintln(os.Stderr, "lakeflow: no lake file names a consistent batch yet (older lake files name none): give an LSN or a time")
	}
	res := warehouse.Result{Columns: []string{"position", "lsn", "_cdc_seq", "commit_ts"}}
	for _, b := range bs {
		commit := "unknown"
		if !b.Commit.IsZero() {
			commit = b.Commit.Format(time.RFC3339Nano)
		}
		vals := []string{fmt.Sprintf("batch:%d", b.Batch), b.Seq.String(), fmt.Sprint(uint64(b.Seq)), commit}
		res.Rows = append(res.Rows, textRow(vals...))
		res.JSON = append(res.JSON, fmt.Sprintf(`{"position":%q,"lsn":%q,"_cdc_seq":%d,"commit_ts":%q}`, vals[0], vals[1], uint64(b.Seq), commit))
	}
	return printResult(os.Stdout, res, c.String("format"))
}

// setupQuiet is setup with warnings and errors only, unless --log-level
// says otherwise: a query's output is what the user asked for.
func setupQuiet(c *cli.Context) (*config.Config, *slog.Logger, error) {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet("log-level") {
			return setup(c)
		}
	}
	if err := c.Set("log-level", "warn"); err != nil {
		return nil, nil, err
	}
	return setup(c)
}
