// Package postgres is the source stage: the embedded cluster, the
// publication and replication slot, the initial snapshot inside the slot's
// exported snapshot, pgoutput decoding and the acknowledged stream.
package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lakeflow/lakeflow/internal/fault"
)

// ErrEnvironment marks problems with the machine: missing server binaries,
// directories PostgreSQL cannot reach, a cluster that does not start.
var ErrEnvironment = fault.ErrEnvironment

// ClusterConfig describes a private PostgreSQL cluster.
type ClusterConfig struct {
	Dir  string // holds data/, password and postgres.log
	Port int    // loopback port
	// Ephemeral trades durability for speed (fsync off); for tests and
	// benchmarks only.
	Ephemeral bool
}

// Cluster is a running private PostgreSQL cluster on 127.0.0.1. The
// superuser is "lakeflow" with a generated password kept 0600 in Dir.
type Cluster struct {
	cfg      ClusterConfig
	bin      string
	password string
	owner    *syscall.Credential // the postgres user when lakeflow runs as root
	log      *slog.Logger
}

const superuser = "lakeflow"

// OpenCluster returns a handle on the cluster in cfg.Dir without starting
// or creating it. As root, the cluster is run by the postgres user, and
// kept under /var/tmp if that user cannot reach cfg.Dir.
func OpenCluster(cfg ClusterConfig, log *slog.Logger) (*Cluster, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, bin: bin, log: log}
	if os.Geteuid() != 0 {
		return c, nil
	}
	if c.owner, err = postgresUser(); err != nil {
		return nil, err
	}
	if err := c.checkReachable(); err != nil {
		// A project under a 0700 home directory: keep the cluster where
		// the postgres user can reach it, stably per data_dir.
		alt := fallbackDir(cfg.Dir)
		log.Warn("the postgres user cannot reach data_dir; keeping the embedded cluster elsewhere", "reason", err.Error(), "dir", alt)
		c.cfg.Dir = alt
		if err := c.checkReachable(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// StartCluster initialises the cluster on first use and starts it. A server
// left running by a killed lakeflow is restarted so the settings apply.
func StartCluster(ctx context.Context, cfg ClusterConfig, log *slog.Logger) (*Cluster, error) {
	c, err := OpenCluster(cfg, log)
	if err != nil {
		return nil, err
	}
	// Parents stay traversable (0755) so the postgres user can reach the
	// cluster when lakeflow runs as root; the cluster itself is private.
	if err := os.MkdirAll(filepath.Dir(c.cfg.Dir), 0o755); err != nil {
		return nil, fmt.Errorf("%w: create %s: %v", ErrEnvironment, filepath.Dir(c.cfg.Dir), err)
	}
	if err := os.Mkdir(c.cfg.Dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("%w: create %s: %v", ErrEnvironment, c.cfg.Dir, err)
	}
	if _, err := os.Stat(filepath.Join(c.dataDir(), "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := c.initdb(ctx); err != nil {
			return nil, err
		}
	}
	pw, err := os.ReadFile(c.passwordFile())
	if err != nil {
		return nil, fmt.Errorf("%w: read cluster password: %v (remove %s to re-create the cluster)", ErrEnvironment, err, c.cfg.Dir)
	}
	c.password = strings.TrimSpace(string(pw))
	if c.run(ctx, "pg_ctl", "status", "-D", c.dataDir()) == nil {
		log.Info("restarting postgres left running by an earlier run", "dir", c.dataDir())
		if err := c.Stop(); err != nil {
			return nil, err
		}
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Start starts the (initialised, stopped) cluster.
func (c *Cluster) Start(ctx context.Context) error {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=''", c.cfg.Port)
	if err := c.run(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", c.dataDir(), "-l", c.logFile(), "-o", opts); err != nil {
		if portTaken(c.cfg.Port) {
			return fmt.Errorf("%w: source.port %d is already in use on 127.0.0.1: choose a free port, or set source.dsn to use the server that holds it", ErrEnvironment, c.cfg.Port)
		}
		return fmt.Errorf("%w: start postgres on 127.0.0.1:%d: %v%s", ErrEnvironment, c.cfg.Port, err, c.logTail())
	}
	c.log.Info("postgres started", "dir", c.dataDir(), "port", c.cfg.Port)
	return nil
}

// portTaken says whether another process listens on the loopback port
// (asked once the server failed to start: before, a server a killed
// lakeflow left running would hold it, and be restarted).
func portTaken(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return errors.Is(err, syscall.EADDRINUSE)
	}
	l.Close()
	return false
}

// FindBinaries returns the directory holding initdb and pg_ctl: from PATH,
// else the newest /usr/lib/postgresql/*/bin.
func FindBinaries() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		// PATH may hold symlinks into the real bin directory, which also
		// has the other server programs.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "initdb")); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w: PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin; install them (Debian: apt-get install postgresql) or set source.dsn", ErrEnvironment)
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Dir is where the cluster lives (see OpenCluster for when it moves).
func (c *Cluster) Dir() string { return c.cfg.Dir }

// Bin returns the path of a server program next to pg_ctl.
func (c *Cluster) Bin(name string) string { return filepath.Join(c.bin, name) }

// DSN returns a URL for database db as the superuser.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", superuser, c.password, c.cfg.Port, db)
}

// Stop shuts the cluster down (fast mode: open sessions are ended).
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.run(ctx, "pg_ctl", "stop", "-w", "-m", "fast", "-D", c.dataDir()); err != nil {
		return fmt.Errorf("%w: stop postgres: %v", ErrEnvironment, err)
	}
	return nil
}

func (c *Cluster) dataDir() string      { return filepath.Join(c.cfg.Dir, "data") }
func (c *Cluster) passwordFile() string { return filepath.Join(c.cfg.Dir, "password") }
func (c *Cluster) logFile() string      { return filepath.Join(c.cfg.Dir, "postgres.log") }

func (c *Cluster) initdb(ctx context.Context) error {
	secret := make([]byte, 18)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	password := hex.EncodeToString(secret)
	// initdb reads the password from a file the server user can read; it
	// lives only for the duration of initdb.
	pwfile := filepath.Join(c.cfg.Dir, ".initdb-pw")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	if err := c.chown(c.cfg.Dir); err != nil {
		return err
	}
	if err := c.chown(pwfile); err != nil {
		return err
	}
	args := []string{"-D", c.dataDir(), "-U", superuser, "--pwfile=" + pwfile,
		"--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8", "--locale=C"}
	if c.cfg.Ephemeral {
		args = append(args, "--no-sync")
	}
	if err := c.run(ctx, "initdb", args...); err != nil {
		return fmt.Errorf("%w: initdb: %v", ErrEnvironment, err)
	}
	settings := []string{
		"wal_level = logical",
		"max_replication_slots = 32",
		"max_wal_senders = 32",
		"logical_decoding_work_mem = '64MB'",
		"max_slot_wal_keep_size = '8GB'",
	}
	if c.cfg.Ephemeral {
		settings = append(settings, "fsync = off", "full_page_writes = off", "synchronous_commit = off")
	}
	conf := filepath.Join(c.dataDir(), "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("\n# lakeflow\n" + strings.Join(settings, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// The password file belongs to lakeflow's user, not to the server's.
	return os.WriteFile(c.passwordFile(), []byte(password+"\n"), 0o600)
}

// run runs a server program, as the postgres user when lakeflow is root,
// and returns its output in the error.
func (c *Cluster) run(ctx context.Context, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, c.Bin(prog), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = c.cfg.Dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "TZ=UTC"}
	if c.owner != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.owner}
		cmd.Env = append(cmd.Env, "HOME="+c.cfg.Dir)
	}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if msg == "" {
			return err
		}
		return fmt.Errorf("%v: %s", err, msg)
	}
	return nil
}

func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\n--- " + c.logFile() + " ---\n" + string(b)
}

func (c *Cluster) chown(path string) error {
	if c.owner == nil {
		return nil
	}
	if err := os.Chown(path, int(c.owner.Uid), int(c.owner.Gid)); err != nil {
		return fmt.Errorf("%w: hand %s to the postgres user: %v", ErrEnvironment, path, err)
	}
	return nil
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: PostgreSQL refuses to run as root and there is no postgres user to run it as; create one (useradd --system postgres) or run lakeflow as another user", ErrEnvironment)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// fallbackDir is where a cluster goes when the postgres user cannot reach
// the configured place: /var/tmp survives reboots, and the name is stable
// for a given data_dir.
func fallbackDir(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join("/var/tmp", "lakeflow-"+hex.EncodeToString(sum[:6]), "pg")
}

// checkReachable makes sure the postgres user can traverse every existing
// parent of the cluster directory; PostgreSQL's own error for this is
// obscure.
func (c *Cluster) checkReachable() error {
	dir, err := filepath.Abs(c.cfg.Dir)
	if err != nil {
		return err
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			if p == "/" {
				return nil
			}
			continue // created below, traversable
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrEnvironment, err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		mode := st.Mode().Perm()
		ok := mode&0o001 != 0 ||
			(sys.Gid == c.owner.Gid && mode&0o010 != 0) ||
			(sys.Uid == c.owner.Uid && mode&0o100 != 0)
		if !ok {
			return fmt.Errorf("%w: lakeflow runs PostgreSQL as the postgres user (it refuses root), which cannot reach %s because %s is mode %04o; run `chmod o+x %s` or put data_dir elsewhere (e.g. under /var/tmp)",
				ErrEnvironment, c.cfg.Dir, p, mode, p)
		}
		if p == "/" {
			return nil
		}
	}
}

// EnsureDatabase creates database name if it does not exist.
func (c *Cluster) EnsureDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("%w: connect to embedded postgres: %v", fault.ErrUnavailable, err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("%w: %v", fault.ErrUnavailable, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("%w: create database %s: %v", fault.ErrUnavailable, name, err)
	}
	return nil
}

// RunningDSN is the DSN of database db of the embedded cluster in dir on
// port, as a running lakeflow started it (its password is kept in dir);
// it does not start anything.
func RunningDSN(dir string, port int, db string) (string, error) {
	c := &Cluster{cfg: ClusterConfig{Dir: dir, Port: port}}
	pw, err := os.ReadFile(c.passwordFile())
	if err != nil {
		return "", err
	}
	c.password = strings.TrimSpace(string(pw))
	return c.DSN(db), nil
}
