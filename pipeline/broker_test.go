package pipeline

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/demo"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestExternalBroker points kafka.brokers at a broker lakeflow did not
// start, as a user with a real Kafka or Redpanda cluster would.
func TestExternalBroker(t *testing.T) {
	port, _ := pgtest.FreePort()
	b, err := kafka.StartBroker(filepath.Join(t.TempDir(), "broker"), fmt.Sprintf("127.0.0.1:%d", port), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := newHarnessWith(t, fmt.Sprintf("brokers = [%q]\ntopic_prefix = \"shop\"", b.Addr()), qualified(demoTables)...)
	if err := demo.Setup(context.Background(), h.dsn); err != nil {
		t.Fatal(err)
	}
	h.run(t, Options{Workload: func(ctx context.Context, dsn string) error {
		_, err := demo.Workload{Events: 2000, Seed: 9}.Run(ctx, dsn)
		return err
	}})
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, demoTables...)
	if n := consumed(t, h.cfg, "orders"); n == 0 {
		t.Fatal("nothing consumed from shop.public.orders")
	}
}
