package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
)

// The failures of lakeflow check, one exit code each (exitCode).
var (
	errCheckContracts = errors.New("contract check failed")
	errCheckCatalog   = errors.New("catalog check failed")
	errCheckData      = errors.New("data check failed")
)

var checkFailures = map[string]error{
	pipeline.PartContracts: errCheckContracts,
	pipeline.PartCatalog:   errCheckCatalog,
	pipeline.PartData:      errCheckData,
}

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "contracts against the live source, the catalog against what exists, and population checks over the data; writes nothing",
		Flags: append(commonFlags(),
			&cli.StringFlag{Name: "only", Usage: "run one part: contracts, catalog or data"},
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			only := c.String("only")
			if only != "" && !slices.Contains(pipeline.CheckParts, only) {
				return fmt.Errorf("%w: --only %q: want %s", fault.ErrConfig, only, strings.Join(pipeline.CheckParts, ", "))
			}
			if c.NArg() > 0 {
				return fmt.Errorf("%w: check takes no arguments (got %q)", fault.ErrConfig, c.Args().First())
			}
			cfg, log, err := setupQuiet(c)
			if err != nil {
				return err
			}
			report, err := pipeline.Check(c.Context, cfg, only, log)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if err := printJSON(report); err != nil {
					return err
				}
			} else if err := printReport(os.Stdout, report); err != nil {
				return err
			}
			if part := report.Failed(); part != "" {
				return fmt.Errorf("%w: see the errors above", checkFailures[part])
			}
			return nil
		},
	}
}

// printReport prints the findings, errors first, a block each (a table
// of them was wider than any terminal: messages and fixes are sentences),
// then a summary line.
func printReport(w io.Writer, r *pipeline.CheckReport) error {
	errs, warns, passed := 0, 0, 0
	for _, n := range r.Passed {
		passed += n
	}
	for _, f := range r.Findings {
		if f.Severity == "error" {
			errs++
		} else {
			warns++
		}
		head := []string{f.Severity, f.Part, f.Check}
		if f.Dataset != "" {
			head = append(head, f.Dataset)
		}
		if f.Count > 0 {
			head = append(head, fmt.Sprint(f.Count))
		}
		what := f.Message
		if len(f.Examples) > 0 {
			what = strings.TrimSuffix(what, ".") + "; e.g. " + strings.Join(f.Examples, ", ")
		}
		lines := []string{what}
		if f.Fix != "" {
			lines = append(lines, "fix: "+f.Fix)
		}
		// A message of several lines (the problems of several files)
		// stays inside its block.
		body := strings.ReplaceAll(strings.TrimRight(strings.Join(lines, "\n"), "\n"), "\n", "\n  ")
		if _, err := fmt.Fprintf(w, "%s\n  %s\n\n", strings.Join(head, " · "), body); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "%d checks passed, %d failed, %d warnings (%.1f s)\n", passed, errs, warns, r.Seconds)
	return err
}
