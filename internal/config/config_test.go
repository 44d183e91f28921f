package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lakeflow/lakeflow/internal/fault"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lakeflow.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRepositoryDefaultFileLoads(t *testing.T) {
	cfg, err := Load("../../lakeflow.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source.DSN != "" || !cfg.Kafka.Embedded() || len(cfg.Source.Tables) != 5 {
		t.Fatalf("default file is not the embedded demo: %+v", cfg)
	}
	if want := filepath.Join(filepath.Dir(cfg.File), "data", "warehouse.duckdb"); cfg.Warehouse.Path != want {
		t.Fatalf("warehouse path %s, want %s (relative to the file)", cfg.Warehouse.Path, want)
	}
}

func TestMissingDefaultFileUsesBuiltInDefaults(t *testing.T) {
	t.Chdir(t.TempDir())
	cfg, err := Load(DefaultFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.File != "" || cfg.Pipeline.BatchInterval != 500*time.Millisecond || cfg.Kafka.RetentionBytes != 1<<30 {
		t.Fatalf("unexpected defaults: %+v", cfg)
	}
	if _, err := Load("other.toml", nil); !errors.Is(err, fault.ErrConfig) {
		t.Fatalf("a named file that is missing must fail, got %v", err)
	}
}

func TestRejectsWhatItCannotUse(t *testing.T) {
	for _, tc := range []struct {
		body string
		env  []string
		want []string // every named key must be in the message
	}{
		{body: "[source]\nslots = \"x\"\n", want: []string{"lakeflow.toml:2: unknown key source.slots (did you mean source.slot?)"}},
		{body: "colour = 1\n[kafka]\nbroker = []\n", want: []string{"lakeflow.toml:1: unknown key colour;", "lakeflow.toml:3: unknown key kafka.broker (did you mean kafka.brokers?)"}},
		{body: "[pipline]\nbatch_events = 1\n", want: []string{"unknown key pipline", "(did you mean pipeline?)"}},
		{body: "[pipeline]\nbatch_events = \"many\"\n", want: []string{"lakeflow.toml:2: pipeline.batch_events: a TOML string where an integer is wanted"}},
		{body: "[source]\ntables = \"public.orders\"\n", want: []string{"lakeflow.toml:2: source.tables: a TOML string where a list of strings is wanted"}},
		{body: "[pipeline]\nbatch_events = 0\nbatch_interval = \"soon\"\nbatch_bytes = \"lots\"\n",
			want: []string{"pipeline.batch_events", "pipeline.batch_interval", "pipeline.batch_bytes"}},
		{body: "[source]\ntables = []\nslot = \"Bad-Slot\"\n", want: []string{"source.tables", "source.slot"}},
		{body: "[source]\ntables = [\"a.orders\", \"b.orders\"]\n", want: []string{"silver.orders"}},
		{body: "[kafka]\npartitions = 0\nbrokers = [\"nohost\"]\n", want: []string{"kafka.partitions", "kafka.brokers"}},
		{body: "[warehouse]\nthreads = -1\n", want: []string{"warehouse.threads"}},
		{body: "", env: []string{"LAKEFLOW_SOURCE_DSNN=x"}, want: []string{"LAKEFLOW_SOURCE_DSNN names no config key (did you mean LAKEFLOW_SOURCE_DSN?)"}},
		{body: "", env: []string{"LAKEFLOW_KAFKA_PARTITIONS=two"}, want: []string{"LAKEFLOW_KAFKA_PARTITIONS", "not an integer"}},
		{body: "", env: []string{"LAKEFLOW_WAREHOUSE_PUBLISH_INTERVAL=1x"}, want: []string{"warehouse.publish_interval", "(set by LAKEFLOW_WAREHOUSE_PUBLISH_INTERVAL)"}},
	} {
		_, err := Load(write(t, tc.body), tc.env)
		if !errors.Is(err, fault.ErrConfig) {
			t.Errorf("%q: want a configuration error, got %v", tc.body, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not name %q", tc.body, err, w)
			}
		}
	}
}

func TestEnvironmentOverridesFile(t *testing.T) {
	p := write(t, "[source]\ndsn = \"postgres://file\"\n[kafka]\nbrokers = [\"a:1\"]\n")
	cfg, err := Load(p, []string{
		"LAKEFLOW_SOURCE_DSN=postgres://env/db",
		"LAKEFLOW_KAFKA_BROKERS= b:2 , c:3 ",
		"LAKEFLOW_SOURCE_TABLES=public.a,shop.b",
		"LAKEFLOW_DATA_DIR=/srv/lf",
		"LAKEFLOW_PIPELINE_BATCH_BYTES=2MB",
		"PATH=/bin",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source.DSN != "postgres://env/db" || strings.Join(cfg.Kafka.Brokers, ",") != "b:2,c:3" ||
		cfg.Source.Tables[1] != (Table{"shop", "b"}) || cfg.DataDir != "/srv/lf" ||
		cfg.Lake.Dir != "/srv/lf/lake" || cfg.Pipeline.BatchBytes != 2e6 {
		t.Fatalf("overrides not applied: %+v", cfg)
	}
}

func FuzzLoad(f *testing.F) {
	data, _ := os.ReadFile("../../lakeflow.toml")
	f.Add(string(data))
	f.Add("[source]\ntables = [\"x\"]\n")
	f.Fuzz(func(t *testing.T, body string) {
		cfg, err := Load(write(t, body), nil)
		if err != nil && !errors.Is(err, fault.ErrConfig) {
			t.Fatalf("error without the configuration class: %v", err)
		}
		if err == nil && (len(cfg.Source.Tables) == 0 || cfg.Pipeline.BatchEvents < 1 || cfg.Warehouse.Path == "") {
			t.Fatalf("invalid configuration accepted: %+v", cfg)
		}
	})
}
