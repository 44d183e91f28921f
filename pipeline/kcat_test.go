package pipeline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os/exec"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
)

// assertKcatReads reads a topic of the (stopped) pipeline with kcat, a
// librdkafka client, and checks every record is a Debezium-style envelope
// of that table.
func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func assertKcatReads(t *testing.T, cfg *config.Config, table string, want int64) {
	t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat not found: install it (apt-get install kcat), or run the tests with scripts/test")
	}
	b, err := kafka.StartBroker(cfg.Kafka.Dir, cfg.Kafka.Listen, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	topic := kafka.TableTopic(cfg.Kafka.TopicPrefix, "public", table)
	out, err := exec.Command(kcat, "-b", b.Addr(), "-C", "-t", topic, "-o", "beginning", "-e", "-q",
		"-f", "%k\t%s\n").Output()
	if err != nil {
		t.Fatalf("kcat: %v", err)
	}
	var n int64
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		key, value, _ := strings.Cut(sc.Text(), "\t")
		var env struct {
			Op     string          `json:"op"`
			After  json.RawMessage `json:"after"`
			Before json.RawMessage `json:"before"`
			Source struct {
				Table string `json:"table"`
			} `json:"source"`
			Seq uint64 `json:"_cdc_seq"`
		}
		if err := json.Unmarshal([]byte(value), &env); err != nil {
			t.Fatalf("kcat record %d is not JSON: %v: %.200s", n, err, value)
		}
		if !strings.Contains("crudt", env.Op) || env.Source.Table != table || env.Seq == 0 ||
			(env.Op != "t" && !json.Valid([]byte(key))) {
			t.Fatalf("kcat record %d is not an envelope of %s: key %s value %.200s", n, table, key, value)
		}
		n++
	}
	if n != want {
		t.Fatalf("kcat read %d records of %s, want %d", n, topic, want)
	}
}
