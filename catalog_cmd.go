package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/catalog"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
	"github.com/lakeflow/lakeflow/warehouse"
)

func catalogCommand() *cli.Command {
	return &cli.Command{
		Name:  "catalog",
		Usage: "the dataset catalog (catalog.dir): print it, or its lineage graph",
		Flags: append(commonFlags(),
			&cli.BoolFlag{Name: "lineage", Usage: "print the lineage graph (Mermaid; --format dot for Graphviz)"},
			&cli.StringFlag{Name: "format", Usage: "the catalog: text (default), csv, json or markdown; the lineage: mermaid (default) or dot"},
		),
		OnUsageError: usageError,
		Subcommands: []*cli.Command{{
			Name:         "init",
			Usage:        "write a catalog entry, derived from the lake, contracts and gold marts, for each dataset that has none",
			Flags:        commonFlags(),
			OnUsageError: usageError,
			Action: func(c *cli.Context) error {
				cfg, log, err := setup(c)
				if err != nil {
					return err
				}
				written, err := pipeline.InitCatalog(c.Context, cfg, log)
				for _, f := range written {
					fmt.Fprintln(os.Stdout, "wrote", f)
				}
				if err == nil && len(written) == 0 {
					fmt.Fprintln(os.Stdout, "every dataset has a catalog entry in", cfg.Catalog.Dir)
				}
				return err
			},
		}},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("%w: catalog takes no arguments (got %q; lakeflow catalog init writes the entries)", fault.ErrConfig, c.Args().First())
			}
			cfg, _, err := setupQuiet(c)
			if err != nil {
				return err
			}
			cat, err := catalog.Load(cfg.Catalog.Dir)
			if err != nil {
				return err
			}
			if len(cat) == 0 {
				return fmt.Errorf("%w: the catalog at %s (catalog.dir) is empty: lakeflow catalog init writes it", fault.ErrConfig, cfg.Catalog.Dir)
			}
			format := c.String("format")
			if c.Bool("lineage") {
				switch format {
				case "", "mermaid":
					_, err = fmt.Fprint(os.Stdout, cat.Mermaid())
				case "dot":
					_, err = fmt.Fprint(os.Stdout, cat.DOT())
				default:
					return fmt.Errorf("%w: --format %q: the lineage is mermaid or dot", fault.ErrConfig, format)
				}
				return err
			}
			if format == "" {
				format = "text"
			}
			if err := checkFormat(format); err != nil {
				return err
			}
			return printResult(os.Stdout, catalogTable(cat), format)
		},
	}
}

// catalogTable is the catalog as a result to print.
func catalogTable(cat catalog.Catalog) warehouse.Result {
	res := warehouse.Result{Columns: []string{"dataset", "kind", "owner", "consumers", "cadence", "freshness", "columns", "derived_from"}}
	for _, d := range cat {
		fresh := ""
		if d.Freshness > 0 {
			fresh = catalog.ShortDuration(d.Freshness)
		}
		vals := []string{d.Name, string(d.Kind), d.Owner, strings.Join(d.Consumers, ", "), d.Cadence, fresh,
			fmt.Sprint(len(d.Columns)), strings.Join(d.DerivedFrom, ", ")}
		res.Rows = append(res.Rows, textRow(vals...))
		res.JSON = append(res.JSON, d.JSON())
	}
	return res
}
