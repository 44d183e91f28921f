// Command lakeflow turns a PostgreSQL database into a lakehouse on one
// machine: WAL → Kafka → Parquet lake + DuckDB warehouse.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/lakeflow/lakeflow/internal/build"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline"
	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// Exit codes; main is the only place that maps errors to them.
const (
	exitOK          = 0
	exitInternal    = 1
	exitConfig      = 2
	exitEnvironment = 3
	exitCheck       = 4
	// lakeflow check: the first part that failed.
	exitCheckContracts = 5
	exitCheckCatalog   = 6
	exitCheckData      = 7
	// A query, or a position or table it asks about, is wrong.
	exitQuery = 8
)

func main() {
	app := newApp()
	err := app.Run(flagsFirst(app, os.Args))
	reportError(os.Stderr, jsonAsked(os.Args), err)
	os.Exit(exitCode(err))
}

// jsonAsked says whether the arguments ask for --log-format json, read
// from them rather than from the command's flags: a usage error or a bad
// --log-level ends the command before its flags are.
func jsonAsked(args []string) bool {
	for i, a := range args {
		name, value, eq := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") && name == "log-format" {
			if !eq && i+1 < len(args) {
				value = args[i+1]
			}
			return value == "json"
		}
	}
	return false
}

// reportError writes the error a command ended with as one line: plain
// text, or with asJSON a JSON record as --log-format json writes them,
// whatever --log-level (so that a log read as JSON lines stays one to
// its end).
func reportError(w io.Writer, asJSON bool, err error) {
	if err == nil {
		return
	}
	msg := fault.OneLine(err.Error())
	if asJSON {
		slog.New(slog.NewJSONHandler(w, nil)).Error("lakeflow stopped", "err", msg, "exit", exitCode(err))
		return
	}
	fmt.Fprintf(w, "lakeflow: %s\n", msg)
}

func newApp() *cli.App {
	return &cli.App{
		Name:           "lakeflow",
		Usage:          "PostgreSQL WAL → Kafka → Parquet lake + DuckDB warehouse, in one process",
		Version:        build.Version(),
		Flags:          commonFlags(),
		Commands:       []*cli.Command{runCommand(), contractsCommand(), backfillCommand(), asofCommand(), catalogCommand(), checkCommand(), sqlCommand(), statusCommand(), resyncCommand(), compactCommand(), psqlCommand(), initCommand(), reportCommand()},
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   usageError,
		CommandNotFound: func(c *cli.Context, name string) {
			var names []string
			for _, cmd := range c.App.Commands {
				names = append(names, cmd.Name)
			}
			if c.Command != nil {
				names = nil
				for _, cmd := range c.Command.Subcommands {
					names = append(names, cmd.Name)
				}
			}
			fmt.Fprintf(os.Stderr, "lakeflow: unknown command %q%s (run %s --help)\n", name, fault.DidYouMean(name, names), commandPath(c))
			os.Exit(exitConfig)
		},
	}
}

// flagsFirst moves the flags of a command given after its arguments
// (lakeflow asof 0/16B3748 --table orders) before them: urfave/cli stops
// reading flags at the first argument.
func flagsFirst(app *cli.App, args []string) []string {
	// The command (down to its subcommand) the arguments name: flags and
	// their values before it are skipped.
	var cmd *cli.Command
	flags := app.Flags
	at := 1
	for at < len(args) {
		a := args[at]
		if a == "--" {
			break // the arguments, whatever they look like
		}
		if strings.HasPrefix(a, "-") {
			if valued(flags)[strings.TrimLeft(a, "-")] {
				at++
			}
			at++
			continue
		}
		next := app.Command(a)
		if cmd != nil {
			next = cmd.Command(a)
		}
		if next == nil {
			break
		}
		cmd, flags = next, next.Flags
		at++
	}
	if cmd == nil {
		return args
	}
	takesValue := valued(cmd.Flags)
	out := append([]string(nil), args[:at]...)
	var rest []string
	for i := at; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			rest = append(rest, args[i:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && len(a) > 1:
			out = append(out, a)
			if takesValue[strings.TrimLeft(a, "-")] && i+1 < len(args) {
				out = append(out, args[i+1])
				i++
			}
		default:
			rest = append(rest, a)
		}
	}
	return append(out, rest...)
}

// valued names the flags that take a value (given as --name value; a
// flag given as --name=value does not match its name).
func valued(flags []cli.Flag) map[string]bool {
	out := map[string]bool{}
	for _, f := range flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			out[n] = !isBool
		}
	}
	return out
}

func exitCode(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, fault.ErrQuery):
		return exitQuery
	case errors.Is(err, fault.ErrConfig):
		return exitConfig
	case errors.Is(err, fault.ErrEnvironment), errors.Is(err, fault.ErrUnavailable), errors.Is(err, fault.ErrSource):
		return exitEnvironment
	case errors.Is(err, fault.ErrSchemaBreak), errors.Is(err, fault.ErrCheckFailed):
		return exitCheck
	case errors.Is(err, errCheckContracts):
		return exitCheckContracts
	case errors.Is(err, errCheckCatalog):
		return exitCheckCatalog
	case errors.Is(err, errCheckData):
		return exitCheckData
	}
	var usage interface{ ExitCode() int }
	if errors.As(err, &usage) {
		return exitConfig
	}
	return exitInternal
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "snapshot if needed, then move the WAL up to its current end through Kafka into lake and warehouse",
		Flags: append(commonFlags(),
			&cli.BoolFlag{Name: "follow", Usage: "keep running; Ctrl-C finishes the in-flight batch and exits, a second Ctrl-C at once"},
			&cli.BoolFlag{Name: "demo", Usage: "create the demo schema in the source and drive an e-commerce workload while ingesting"},
			&cli.IntFlag{Name: "demo-events", Value: 20000, Usage: "number of row changes the demo workload makes"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics at this address (/metrics; :9464 binds loopback)"},
			&cli.StringFlag{Name: "profile", Usage: "write CPU (by pipe stage) and heap profiles of the run to this directory (go tool pprof)"},
		),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("%w: run takes no arguments (got %q)", fault.ErrConfig, c.Args().First())
			}
			if c.IsSet("demo-events") && !c.Bool("demo") {
				return fmt.Errorf("%w: --demo-events sizes the demo's workload: add --demo, or leave it out", fault.ErrConfig)
			}
			cfg, log, err := setup(c)
			if err != nil {
				return err
			}
			if cfg.File == "" {
				log.Info("no "+config.DefaultFile+" here: lakeflow runs on its built-in defaults (an embedded PostgreSQL and Kafka, everything under data_dir)", "data_dir", cfg.DataDir)
			}
			// Logging is best-effort, shutdown is not: a Ctrl-C that also
			// ends the tee of `run 2>&1 | tee run.log` leaves the log a
			// broken pipe, which must fail writes rather than kill the
			// run before it commits and stops the embedded PostgreSQL.
			signal.Ignore(syscall.SIGPIPE)
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			defer onInterrupt(ctx, stop, log)()
			opts := pipeline.Options{Follow: c.Bool("follow"), MetricsAddr: c.String("metrics-addr")}
			if isTerminal(os.Stderr) {
				opts.Progress = os.Stderr
			}
			if c.Bool("demo") {
				if c.Int("demo-events") < 1 {
					return fmt.Errorf("%w: --demo-events must be at least 1", fault.ErrConfig)
				}
				if cfg.Source.DSN != "" {
					if err := demo.CheckSource(ctx, cfg.Source.DSN); err != nil {
						return err
					}
				}
				if err := demo.WriteProject(cfg, log); err != nil {
					return err
				}
				w := demo.Workload{Events: c.Int("demo-events"), Seed: 1}
				opts.Prepare, opts.Show = demo.Setup, true
				opts.Workload = func(ctx context.Context, dsn string) error {
					done, err := w.Run(ctx, dsn)
					if err != nil {
						return err
					}
					log.Info("demo workload done", "changes", done.Changes, "transactions", done.Transactions)
					return nil
				}
			}
			if dir := c.String("profile"); dir != "" {
				stop, err := startProfile(dir)
				if err != nil {
					return err
				}
				defer func() {
					if err := stop(); err != nil {
						log.Warn("profiles not written", "dir", dir, "err", err)
					}
				}()
			}
			if err := pipeline.Run(ctx, cfg, opts, log); err != nil {
				if errors.Is(err, fault.ErrSource) && cfg.Source.DSN == "" {
					// The statement the message asks for needs a server,
					// and the embedded one stopped with the run.
					err = fmt.Errorf("%w (the embedded PostgreSQL runs only while lakeflow does: %s psql -- -c '<statement>' runs one)", err, invocation())
				}
				return err
			}
			if c.Bool("demo") && ctx.Err() == nil {
				demo.PrintNextSteps(os.Stdout, cfg, invocation())
			}
			return nil
		},
	}
}

func contractsCommand() *cli.Command {
	return &cli.Command{
		Name:         "contracts",
		Usage:        "data contracts (contracts.dir)",
		Flags:        commonFlags(),
		OnUsageError: usageError,
		Subcommands: []*cli.Command{{
			Name:  "init",
			Usage: "write a contract, from the live source schema, for each captured table that has none",
			Flags: append(commonFlags(),
				&cli.StringFlag{Name: "table", Usage: "only this table (schema.table, as in source.tables)"},
			),
			OnUsageError: usageError,
			Action: func(c *cli.Context) error {
				cfg, log, err := setup(c)
				if err != nil {
					return err
				}
				written, err := pipeline.InitContracts(c.Context, cfg, c.String("table"), log)
				for _, f := range written {
					fmt.Fprintln(os.Stdout, "wrote", f)
				}
				if err == nil && len(written) == 0 {
					fmt.Fprintln(os.Stdout, "every captured table has a contract in", cfg.Contracts.Dir)
				}
				return err
			},
		}},
	}
}

// usageError reports a bad flag in one line instead of the help text.
// A "flag" with a space in it is an argument that starts with a dash (a
// query beginning with a -- comment): it goes after --.
func usageError(c *cli.Context, err error, _ bool) error {
	const undefined = "flag provided but not defined: "
	if msg := err.Error(); strings.HasPrefix(msg, undefined) && strings.ContainsAny(msg[len(undefined):], " \t\n") {
		arg, _, _ := strings.Cut(msg[len(undefined):], "\n")
		return fmt.Errorf("%w: %q is not a flag (it holds a space): an argument that starts with - goes after -- (%s [flags] -- '<argument>')",
			fault.ErrConfig, "-"+arg, commandPath(c))
	}
	return fmt.Errorf("%w: %v (see %s --help)", fault.ErrConfig, err, commandPath(c))
}

// commandPath names c's command as typed: lakeflow contracts init
// (urfave/cli's FullName leaves out the parents of a subcommand).
func commandPath(c *cli.Context) string {
	var names []string
	for _, ctx := range c.Lineage() {
		if ctx.Command != nil && ctx.Command.Name != "" && ctx.Command.Name != c.App.Name &&
			(len(names) == 0 || names[0] != ctx.Command.Name) {
			names = append([]string{ctx.Command.Name}, names...)
		}
	}
	return strings.Join(append([]string{c.App.Name}, names...), " ")
}

// invocation is how to run lakeflow again as this process was run: go
// run builds it into a temporary directory the next command cannot reuse.
func invocation() string {
	if strings.Contains(os.Args[0], string(filepath.Separator)+"go-build") {
		return "go run ."
	}
	return os.Args[0]
}

// commonFlags are accepted before the command and after it.
func commonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Value: config.DefaultFile, Usage: "config file (missing default file = built-in defaults)"},
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text (key=value lines) or json (one object per line)"},
	}
}

// common returns a common flag's value: the command's if given there,
// else the one given before the command, else the default.
func common(c *cli.Context, name string) string {
	for _, ctx := range c.Lineage() { // the command first, then the app
		if ctx.IsSet(name) {
			return ctx.String(name)
		}
	}
	return c.String(name)
}

// setup loads the configuration and builds the logger.
func setup(c *cli.Context) (*config.Config, *slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(common(c, "log-level"))); err != nil {
		return nil, nil, fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", fault.ErrConfig, common(c, "log-level"))
	}
	var out io.Writer = os.Stderr
	if isTerminal(os.Stderr) {
		out = lineClearing{os.Stderr} // log lines go above the progress line
	}
	var handler slog.Handler
	switch f := common(c, "log-format"); f {
	case "text":
		handler = slog.NewTextHandler(out, &slog.HandlerOptions{Level: level})
	case "json":
		handler = slog.NewJSONHandler(out, &slog.HandlerOptions{Level: level})
	default:
		return nil, nil, fmt.Errorf("%w: --log-format %q: want text or json", fault.ErrConfig, f)
	}
	log := slog.New(handler)
	cfg, err := config.Load(common(c, "config"), os.Environ())
	if err != nil {
		return nil, nil, err
	}
	return cfg, log, nil
}

// lineClearing erases the progress line before each log record; the next
// progress tick redraws it.
type lineClearing struct{ w io.Writer }

func (l lineClearing) Write(p []byte) (int, error) {
	if _, err := io.WriteString(l.w, "\r\033[K"); err != nil {
		return 0, err
	}
	return l.w.Write(p)
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
