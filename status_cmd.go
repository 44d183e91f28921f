package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "how the pipeline stands: published copy, last batch, slot and consumer lag, freshness, quarantine, dead letters, lake (running or not)",
		Flags: append(commonFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("%w: status takes no arguments (got %q)", fault.ErrConfig, c.Args().First())
			}
			cfg, log, err := setupQuiet(c)
			if err != nil {
				return err
			}
			r, err := pipeline.Status(c.Context, cfg, log)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(r)
			}
			printStatus(os.Stdout, r)
			return nil
		},
	}
}

// printStatus prints the report for a person, one fact a line.
func printStatus(w io.Writer, r *pipeline.StatusReport) {
	if p := r.Published; p != nil {
		fmt.Fprintf(w, "published     batch %d, as of %s (committed %s), %s old\n", p.Batch, p.LSN, p.CommitTime.Format(time.RFC3339), ago(p.AgeSeconds))
	}
	if b := r.LastBatch; b != nil {
		fmt.Fprintf(w, "last batch    %d at %s: %d events, consistent %v; %.0f events/s over the last minute\n",
			b.Batch, b.At.Format(time.RFC3339), b.Events, b.Consistent, b.EventsPerSecond)
	}
	if s := r.Slot; s != nil {
		// PostgreSQL measures a stream's lag only while changes flow.
		state := "no reader connected"
		switch {
		case s.Active && s.LagSeconds != nil:
			state = "being read, " + ago(*s.LagSeconds) + " behind"
		case s.Active:
			state = "being read, idle"
		}
		fmt.Fprintf(w, "slot          %s: %d bytes behind the source's WAL; %s\n", s.Name, s.LagBytes, state)
	}
	for _, s := range r.InactiveSlots {
		lost := ""
		if s.Lost {
			lost = " (invalidated by max_slot_wal_keep_size)"
		}
		fmt.Fprintf(w, "inactive slot %s%s: read by no one, holds %d bytes of WAL; unless another tool uses it, run %s\n", s.Name, lost, s.RetainedBytes, s.Drop())
	}
	for _, p := range r.Parked {
		if p.Released != 0 {
			fmt.Fprintf(w, "released      %s: catching up on its changes since %s\n", p.Table, p.At)
			continue
		}
		fmt.Fprintf(w, "PARKED        %s since %s (at %s), its changes held in the WAL: %s; %s\n", p.Table, time.UnixMicro(p.Since).Format(time.DateTime), p.At, p.Reason, p.Fix)
	}
	for _, c := range r.Copies {
		how := "copied while the stream runs"
		if c.Reconcile {
			how = "resync: rows gone from the source are deleted when it ends"
		}
		fmt.Fprintf(w, "copying       %s: %d rows so far (%s)\n", c.Table, c.Rows, how)
	}
	for _, t := range r.Topics {
		fmt.Fprintf(w, "consumer lag  %s: %d records\n", t.Topic, t.Lag)
	}
	for _, d := range r.Datasets {
		mark := ""
		if d.Breach {
			mark = fmt.Sprintf("  BREACH of its %s SLA", ago(d.SLASeconds))
		}
		fmt.Fprintf(w, "freshness     %s: newest change %s old%s\n", d.Dataset, ago(d.AgeSeconds), mark)
	}
	// The rules that held back most first.
	names := slices.Collect(maps.Keys(r.Held.TopRules))
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(r.Held.TopRules[b], r.Held.TopRules[a]), cmp.Compare(a, b))
	})
	held := fmt.Sprint(r.Held.Quarantined)
	if len(names) > 0 {
		rules := make([]string, len(names))
		for i, rule := range names {
			rules[i] = fmt.Sprintf("%s %d", rule, r.Held.TopRules[rule])
		}
		held += " (" + strings.Join(rules, ", ") + ")"
	}
	fmt.Fprintf(w, "quarantined   %s; dead letters %d\n", held, r.Held.Dead)
	tables := make([]string, 0, len(r.Lake))
	for t := range r.Lake {
		tables = append(tables, t)
	}
	slices.Sort(tables)
	for _, t := range tables {
		fmt.Fprintf(w, "lake          %s: %d files, %.1f MB\n", t, r.Lake[t].Files, float64(r.Lake[t].Bytes)/1e6)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note          %s\n", n)
	}
}

// ago writes seconds as a short duration, to a tenth of a second below a
// minute (milliseconds below one second), to the second above: ages side
// by side read alike.
func ago(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
