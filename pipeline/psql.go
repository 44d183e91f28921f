package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
)

// reachSource gives the source's DSN to a command that reads it beside a
// pipeline or without one: source.dsn; else the embedded PostgreSQL,
// where the lakeflow run that holds the data directory runs it, or
// started for the command (the data directory locked meanwhile, so no
// run starts under it) and stopped by release.
func reachSource(ctx context.Context, cfg *config.Config, log *slog.Logger) (dsn string, release func(), err error) {
	if cfg.Source.DSN != "" {
		return cfg.Source.DSN, func() {}, nil
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		// lakeflow run holds the data directory: its cluster runs.
		e := cfg.Source.Embedded
		dsn, err := postgres.RunningDSN(e.Dir, e.Port, e.Database)
		return dsn, func() {}, err
	}
	env, err := startEnvironment(ctx, cfg, false, log)
	release = func() {
		env.stop(log)
		unlock()
	}
	if err != nil {
		release()
		return "", nil, err
	}
	return env.dsn, release, nil
}

// Psql runs psql on the source, with args after the connection, on the
// caller's terminal: the embedded PostgreSQL runs only while a lakeflow
// command does, so this is how its user reaches it (to set a table's
// REPLICA IDENTITY, say) between runs. Ctrl-C belongs to psql meanwhile.
func Psql(ctx context.Context, cfg *config.Config, args []string, log *slog.Logger) error {
	bin, err := psqlBinary()
	if err != nil {
		return err
	}
	// A terminal closed (SIGHUP) or a stop asked (SIGTERM) goes to psql,
	// and the server started for the session is stopped after it, as at
	// its end: killed, lakeflow would leave it running.
	stops := make(chan os.Signal, 1)
	signal.Notify(stops, syscall.SIGHUP, syscall.SIGTERM)
	defer signal.Stop(stops)
	signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
	defer signal.Reset(syscall.SIGINT, syscall.SIGQUIT)
	dsn, release, err := reachSource(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer release()
	dsn, password := withoutPassword(dsn)
	cmd := exec.CommandContext(ctx, bin, append([]string{"--dbname", dsn}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if password != "" {
		// (In the environment, not on psql's command line, where every
		// user of the machine could read it.)
		cmd.Env = append(os.Environ(), "PGPASSWORD="+password)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%w: psql: %v", fault.ErrEnvironment, err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case s := <-stops:
			cmd.Process.Signal(s)
		case <-done:
		}
	}()
	err = cmd.Wait()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		// psql said why on stderr: 2 is a connection that failed, the
		// others the session's statements.
		class := fault.ErrQuery
		if ee.ExitCode() == 2 {
			class = fault.ErrUnavailable
		}
		return fmt.Errorf("%w: psql exited with status %d", class, ee.ExitCode())
	}
	if err != nil {
		return fmt.Errorf("%w: psql: %v", fault.ErrEnvironment, err)
	}
	return nil
}

// withoutPassword takes the password out of a postgres:// DSN.
func withoutPassword(dsn string) (string, string) {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return dsn, ""
	}
	password, ok := u.User.Password()
	if !ok {
		return dsn, ""
	}
	u.User = url.User(u.User.Username())
	return u.String(), password
}

// psqlBinary finds psql: on PATH, or beside the PostgreSQL server
// binaries.
func psqlBinary() (string, error) {
	if p, err := exec.LookPath("psql"); err == nil {
		return p, nil
	}
	if dir, err := postgres.FindBinaries(); err == nil {
		p := filepath.Join(dir, "psql")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: psql not found on PATH or beside the PostgreSQL server binaries: install the PostgreSQL client (Debian: apt-get install postgresql-client)", fault.ErrEnvironment)
}
