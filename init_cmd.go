package main

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// projectConfig is the repository's lakeflow.toml, every key with its
// default and why, which lakeflow init writes into a project.
//
//go:embed lakeflow.toml
var projectConfig []byte

func initCommand() *cli.Command {
	return &cli.Command{
		Name:         "init",
		Usage:        "make a directory (default: this one) a lakeflow project: lakeflow.toml and the demo's contracts/, catalog/ and sql/gold/, from the binary; files that exist are kept",
		ArgsUsage:    "[DIR]",
		Flags:        commonFlags(),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return fmt.Errorf("%w: init takes one directory (got %d arguments)", fault.ErrConfig, c.NArg())
			}
			dir := "."
			if c.NArg() == 1 {
				dir = c.Args().First()
			}
			written, kept, err := demo.Init(dir, projectConfig)
			if err != nil {
				return err
			}
			abs, _ := filepath.Abs(dir)
			if len(written) == 0 {
				fmt.Fprintf(os.Stdout, "%s is a lakeflow project already: nothing written\n", abs)
				return nil
			}
			fmt.Fprintf(os.Stdout, "wrote %d files into %s: %s\n", len(written), abs, summary(written))
			if len(kept) > 0 {
				fmt.Fprintf(os.Stdout, "kept %d that were there: %s\n", len(kept), summary(kept))
			}
			cd := ""
			if dir != "." {
				cd = "cd " + dir + " && "
			}
			fmt.Fprintf(os.Stdout, "next: %s%s run --demo   (the embedded PostgreSQL and Kafka, an e-commerce workload; edit lakeflow.toml for a database of your own)\n", cd, invocation())
			return nil
		},
	}
}

// summary names files by their directories: lakeflow.toml, contracts/ (5).
func summary(files []string) string {
	var order []string
	count := map[string]int{}
	for _, f := range files {
		d := filepath.Dir(f)
		if d == "." {
			d = f
		} else {
			d += "/"
		}
		if count[d] == 0 {
			order = append(order, d)
		}
		count[d]++
	}
	for i, d := range order {
		if strings.HasSuffix(d, "/") {
			order[i] = fmt.Sprintf("%s (%d)", d, count[d])
		}
	}
	return strings.Join(order, ", ")
}
