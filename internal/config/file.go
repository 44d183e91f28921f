package config

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// file mirrors lakeflow.toml. Durations and sizes stay strings here and are
// parsed in resolve, so a bad value is reported with its key.
type file struct {
	DataDir   string        `toml:"data_dir"`
	Source    sourceFile    `toml:"source"`
	Kafka     kafkaFile     `toml:"kafka"`
	Lake      lakeFile      `toml:"lake"`
	Warehouse warehouseFile `toml:"warehouse"`
	Pipeline  pipelineFile  `toml:"pipeline"`
	Contracts contractsFile `toml:"contracts"`
	Catalog   catalogFile   `toml:"catalog"`
	Check     checkFile     `toml:"check"`
	Gold      goldFile      `toml:"gold"`
	Keep      keepFile      `toml:"bookkeeping"`
}

// keepFile says how long the bookkeeping tables keep their rows.
type keepFile struct {
	Batches string `toml:"batches"`
	Runs    string `toml:"runs"`
	Checks  string `toml:"checks"`
}

type checkFile struct {
	Interval string `toml:"interval"`
}

type catalogFile struct {
	Dir string `toml:"dir"`
}

type goldFile struct {
	Dir     string            `toml:"dir"`
	Refresh map[string]string `toml:"refresh"`
}

type contractsFile struct {
	Dir string `toml:"dir"`
}

type sourceFile struct {
	DSN         string   `toml:"dsn"`
	Tables      []string `toml:"tables"`
	Slot        string   `toml:"slot"`
	Publication string   `toml:"publication"`
	Heartbeat   string   `toml:"heartbeat"`
	Port        int      `toml:"port"`
	Database    string   `toml:"database"`
}

type kafkaFile struct {
	Brokers        []string `toml:"brokers"`
	Listen         string   `toml:"listen"`
	TopicPrefix    string   `toml:"topic_prefix"`
	Partitions     int      `toml:"partitions"`
	Retention      string   `toml:"retention"`
	RetentionBytes string   `toml:"retention_bytes"`
}

type lakeFile struct {
	Dir                string `toml:"dir"`
	CompactTarget      string `toml:"compact_target"`
	CompactGrace       string `toml:"compact_grace"`
	CompactInterval    string `toml:"compact_interval"`
	CheckpointInterval string `toml:"checkpoint_interval"`
}

type warehouseFile struct {
	Path            string `toml:"path"`
	LivePath        string `toml:"live_path"`
	PublishInterval string `toml:"publish_interval"`
	MemoryLimit     string `toml:"memory_limit"`
	Threads         int    `toml:"threads"`
}

type pipelineFile struct {
	BatchEvents   int    `toml:"batch_events"`
	BatchBytes    string `toml:"batch_bytes"`
	BatchInterval string `toml:"batch_interval"`
}

// defaultGoldDir is where the gold marts are, beside the config file.
const defaultGoldDir = "sql/gold"

// DemoTables are the source tables of the demo domain (DESIGN.md).
var DemoTables = []string{
	"public.customers", "public.products", "public.orders", "public.order_items", "public.payments",
}

func defaults() file {
	return file{
		DataDir: "data",
		Source: sourceFile{
			Tables:      append([]string(nil), DemoTables...),
			Slot:        "lakeflow",
			Publication: "lakeflow",
			Heartbeat:   "10s",
			Port:        54329,
			Database:    "lakeflow",
		},
		Kafka: kafkaFile{
			Listen:         "127.0.0.1:9092",
			TopicPrefix:    "lakeflow",
			Partitions:     1,
			Retention:      "168h",
			RetentionBytes: "1GiB",
		},
		Lake:      lakeFile{CompactTarget: "128MiB", CompactGrace: "1h", CompactInterval: "10m", CheckpointInterval: "6h"},
		Warehouse: warehouseFile{PublishInterval: "5s"},
		Keep:      keepFile{Batches: "168h", Runs: "2160h", Checks: "720h"},
		Contracts: contractsFile{Dir: "contracts"},
		Catalog:   catalogFile{Dir: "catalog"},
		Pipeline: pipelineFile{
			BatchEvents:   50000,
			BatchBytes:    "64MiB",
			BatchInterval: "500ms",
		},
	}
}

// mismatchRe reads go-toml's message for a value of the wrong type, which
// names the Go field ("struct field config.pipelineFile.BatchEvents of
// type int") rather than the key.
var mismatchRe = regexp.MustCompile(`^toml: cannot decode TOML (\w+) into struct field \S+ of type (\S+)$`)

// wanted says in TOML's words what a Go type takes.
func wanted(goType string) string {
	switch {
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "int") || strings.HasPrefix(goType, "uint"):
		return "an integer"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "[]string":
		return "a list of strings"
	case strings.HasPrefix(goType, "[]"):
		return "a list of tables"
	case strings.HasPrefix(goType, "map["):
		return "a table"
	}
	return "a table" // a struct: a [section]
}

// decodeProblem is a decoding error as the key it concerns and what that
// key takes, when it is a value of the wrong type; else go-toml's text.
func decodeProblem(de *toml.DecodeError) string {
	key := strings.Join(de.Key(), ".")
	if m := mismatchRe.FindStringSubmatch(de.Error()); m != nil && key != "" {
		return fmt.Sprintf("%s: a TOML %s where %s is wanted", key, m[1], wanted(m[2]))
	}
	return de.Error()
}

var (
	identRe  = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	topicRe  = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	sizeRe   = regexp.MustCompile(`^\s*([0-9]+)\s*([KMGT]i?B|B)?\s*$`)
	sizeUnit = map[string]int64{"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
		"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
)

// resolve turns the file into a Config, collecting every problem.
func (f file) resolve(base string) (*Config, []string) {
	var problems []string
	bad := func(key, format string, args ...any) {
		problems = append(problems, key+": "+fmt.Sprintf(format, args...))
	}
	abs := func(key, p string) string {
		if p == "" {
			bad(key, "must not be empty")
			return ""
		}
		if filepath.IsAbs(p) {
			return filepath.Clean(p)
		}
		return filepath.Join(base, p)
	}
	duration := func(key, s string) time.Duration {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			bad(key, "%q is not a positive duration like \"10s\"", s)
		}
		return d
	}
	size := func(key, s string) int64 {
		m := sizeRe.FindStringSubmatch(s)
		if m == nil {
			bad(key, "%q is not a size like \"64MiB\"", s)
			return 0
		}
		var n int64
		fmt.Sscan(m[1], &n)
		if n <= 0 {
			bad(key, "must be positive")
		}
		return n * sizeUnit[m[2]]
	}

	c := &Config{DataDir: abs("data_dir", f.DataDir)}

	s := f.Source
	c.Source = Source{
		DSN:         strings.TrimSpace(s.DSN),
		Slot:        s.Slot,
		Publication: s.Publication,
		Heartbeat:   duration("source.heartbeat", s.Heartbeat),
		Embedded: EmbeddedPostgres{
			Dir:      filepath.Join(c.DataDir, "pg"),
			Port:     s.Port,
			Database: s.Database,
		},
	}
	if !identRe.MatchString(s.Slot) || len(s.Slot) > 63 {
		bad("source.slot", "%q must be a lower-case PostgreSQL identifier (letters, digits, _)", s.Slot)
	}
	if !identRe.MatchString(s.Publication) {
		bad("source.publication", "%q must be a lower-case PostgreSQL identifier", s.Publication)
	}
	if c.Source.DSN == "" {
		if s.Port < 1 || s.Port > 65535 {
			bad("source.port", "%d is not a TCP port", s.Port)
		}
		if !identRe.MatchString(s.Database) {
			bad("source.database", "%q must be a lower-case PostgreSQL identifier", s.Database)
		}
	}
	if len(s.Tables) == 0 {
		bad("source.tables", "list at least one table, like [\"public.orders\"]")
	}
	c.Source.Tables = tableList(s.Tables, func(format string, args ...any) { bad("source.tables", format, args...) })

	k := f.Kafka
	c.Kafka = Kafka{
		Listen:         k.Listen,
		Dir:            filepath.Join(c.DataDir, "kafka"),
		TopicPrefix:    k.TopicPrefix,
		Partitions:     k.Partitions,
		Retention:      duration("kafka.retention", k.Retention),
		RetentionBytes: size("kafka.retention_bytes", k.RetentionBytes),
	}
	for _, b := range k.Brokers {
		if b = strings.TrimSpace(b); b != "" {
			c.Kafka.Brokers = append(c.Kafka.Brokers, b)
		}
	}
	for _, b := range c.Kafka.Brokers {
		if !strings.Contains(b, ":") {
			bad("kafka.brokers", "%q must be host:port", b)
		}
	}
	if c.Kafka.Embedded() && !strings.Contains(k.Listen, ":") {
		bad("kafka.listen", "%q must be host:port", k.Listen)
	}
	if !topicRe.MatchString(k.TopicPrefix) {
		bad("kafka.topic_prefix", "%q may hold only letters, digits, '.', '_' and '-'", k.TopicPrefix)
	}
	if k.Partitions < 1 || k.Partitions > 64 {
		bad("kafka.partitions", "%d must be between 1 and 64", k.Partitions)
	}

	c.Lake.Dir = filepath.Join(c.DataDir, "lake")
	if f.Lake.Dir != "" {
		c.Lake.Dir = abs("lake.dir", f.Lake.Dir)
	}
	c.Lake.CompactTarget = size("lake.compact_target", f.Lake.CompactTarget)
	c.Lake.CompactGrace = duration("lake.compact_grace", f.Lake.CompactGrace)
	if v := strings.TrimSpace(f.Lake.CompactInterval); v != "off" {
		c.Lake.CompactInterval = duration("lake.compact_interval", v)
	}
	if v := strings.TrimSpace(f.Lake.CheckpointInterval); v != "off" {
		c.Lake.CheckpointInterval = duration("lake.checkpoint_interval", v)
	}
	c.Warehouse.Path = filepath.Join(c.DataDir, "warehouse.duckdb")
	if f.Warehouse.Path != "" {
		c.Warehouse.Path = abs("warehouse.path", f.Warehouse.Path)
	}
	c.Warehouse.Live = filepath.Join(c.DataDir, "live.duckdb")
	if f.Warehouse.LivePath != "" {
		c.Warehouse.Live = abs("warehouse.live_path", f.Warehouse.LivePath)
	}
	if c.Warehouse.Live == c.Warehouse.Path {
		bad("warehouse.live_path", "is warehouse.path: the warehouse lakeflow writes and the one it publishes are two files")
	}
	c.Warehouse.PublishInterval = duration("warehouse.publish_interval", f.Warehouse.PublishInterval)
	if f.Warehouse.MemoryLimit != "" {
		c.Warehouse.MemoryLimit = size("warehouse.memory_limit", f.Warehouse.MemoryLimit)
	}
	if c.Warehouse.Threads = f.Warehouse.Threads; c.Warehouse.Threads < 0 {
		bad("warehouse.threads", "%d must be 0 (the command's default) or more", c.Warehouse.Threads)
	}

	c.Contracts.Dir = abs("contracts.dir", f.Contracts.Dir)
	c.Catalog.Dir = abs("catalog.dir", f.Catalog.Dir)

	c.Gold = Gold{Dir: filepath.Join(base, defaultGoldDir), Refresh: map[string]Refresh{}}
	if f.Gold.Dir != "" {
		c.Gold.Dir, c.Gold.DirSet = abs("gold.dir", f.Gold.Dir), true
	}
	for mart, v := range f.Gold.Refresh {
		key := "gold.refresh." + mart
		switch v = strings.TrimSpace(v); v {
		case "batch":
		case "manual":
			c.Gold.Refresh[mart] = Refresh{Manual: true}
		default:
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				bad(key, "%q: want \"batch\", \"manual\" or an interval like \"1m\"", v)
			}
			c.Gold.Refresh[mart] = Refresh{Every: d}
		}
	}

	p := f.Pipeline
	c.Pipeline = Pipeline{
		BatchEvents:   p.BatchEvents,
		BatchBytes:    size("pipeline.batch_bytes", p.BatchBytes),
		BatchInterval: duration("pipeline.batch_interval", p.BatchInterval),
	}
	if p.BatchEvents < 1 {
		bad("pipeline.batch_events", "%d must be at least 1", p.BatchEvents)
	}
	if v := strings.TrimSpace(f.Check.Interval); v != "" && v != "off" {
		c.Check.Interval = duration("check.interval", v)
	}
	keep := func(key, v string) time.Duration {
		if v = strings.TrimSpace(v); v == "forever" {
			return 0
		}
		return duration(key, v)
	}
	c.Bookkeeping = Bookkeeping{
		Batches: keep("bookkeeping.batches", f.Keep.Batches),
		Runs:    keep("bookkeeping.runs", f.Keep.Runs),
		Checks:  keep("bookkeeping.checks", f.Keep.Checks),
	}
	return c, problems
}

// DecodeStrict decodes a TOML file of lakeflow's (lakeflow.toml, a
// contract, a catalog entry) into v, refusing unknown keys; every problem
// names the file and line.
func DecodeStrict(path string, data []byte, v any) error {
	err := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields().Decode(v)
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		return errors.New(unknownKeys(path, strict, v))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		return fmt.Errorf("%s:%d: %s", path, row, decodeProblem(de))
	}
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	return nil
}
