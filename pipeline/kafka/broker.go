// Package kafka is the decoupling point: the embedded broker, topics, the
// producer the source writes into (with the source's own durable state)
// and the consumer the warehouse reads from.
package kafka

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/internal/stage"
)

// MaxMessageBytes bounds one record (one row change). The embedded broker
// accepts it; an external broker must allow it too (message.max.bytes).
const MaxMessageBytes = 32 << 20

// Broker is the embedded Kafka-compatible broker (kfake), persisted under
// its data directory and reachable by any Kafka client on its address.
type Broker struct {
	cluster *kfake.Cluster
	addr    string
}

// StartBroker starts the embedded broker. Its topics, records and group
// offsets survive restarts, including kill -9.
func StartBroker(dir, listen string, log *slog.Logger) (*Broker, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka.listen %q: %v", fault.ErrConfig, listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka.listen %q: bad port", fault.ErrConfig, listen)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: create %s: %v", fault.ErrEnvironment, dir, err)
	}
	opts := []kfake.Opt{
		kfake.DataDir(dir),
		// Every produce is on disk before it is acknowledged, so the slot
		// never advances past records a power loss could take.
		kfake.SyncWrites(),
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.ClusterID("lakeflow"),
		kfake.BrokerConfigs(map[string]string{
			"message.max.bytes": strconv.Itoa(MaxMessageBytes),
			// kfake applies retention every log.cleaner.backoff.ms (an
			// hour by default); topics carry their own retention.
			"log.cleaner.backoff.ms": "60000",
			// Nothing is deleted by age unless a topic asks: lakeflow trims
			// its topics itself, never below what the warehouse committed.
			"log.retention.ms": "-1",
		}),
	}
	if host != "127.0.0.1" && host != "localhost" {
		opts = append(opts, kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, listen)
		}))
	}
	var c *kfake.Cluster
	stage.Within(stage.Broker, func() { c, err = kfake.NewCluster(opts...) })
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w: kafka.listen %s is already in use: choose a free address, or set kafka.brokers to use the broker that holds it", fault.ErrEnvironment, listen)
		}
		return nil, fmt.Errorf("%w: start embedded Kafka in %s: %v", fault.ErrEnvironment, dir, err)
	}
	b := &Broker{cluster: c, addr: c.ListenAddrs()[0]}
	log.Info("kafka started", "addr", b.addr, "dir", dir)
	return b, nil
}

// Addr is the broker's bootstrap address.
func (b *Broker) Addr() string { return b.addr }

// Close persists and stops the broker.
func (b *Broker) Close() { b.cluster.Close() }
