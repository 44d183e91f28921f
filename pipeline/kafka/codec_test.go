package kafka

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/pipeline/demo"
)

// BenchmarkCodec moves envelopes of the demo's orders through the
// embedded broker, producer to consumer, with each batch compression the
// producer could use: the CPU per event (both clients and the broker,
// which writes every produce to disk) and the bytes the broker keeps.
// The first codec also warms the process up, and one round moves by a
// third on a shared machine: compare the others over several rounds,
//
//	for i in 1 2 3; do go test ./pipeline/kafka -run '^$' -bench Codec -benchtime 30x; done
func BenchmarkCodec(b *testing.B) {
	values := demoOrders(20000)
	for _, c := range []struct {
		name  string
		codec kgo.CompressionCodec
	}{
		{"none", kgo.NoCompression()},
		{"lz4", kgo.Lz4Compression()},
		{"snappy", kgo.SnappyCompression()},
		{"zstd", kgo.ZstdCompression()},
	} {
		b.Run(c.name, func(b *testing.B) {
			dir := b.TempDir()
			broker, err := StartBroker(filepath.Join(dir, "kafka"), "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				b.Fatal(err)
			}
			defer broker.Close()
			prod, err := newClient([]string{broker.Addr()}, producerOpts(c.codec)...)
			if err != nil {
				b.Fatal(err)
			}
			defer prod.Close()
			ctx := context.Background()
			if _, err := ensureTopic(ctx, prod, "orders", 1, nil); err != nil {
				b.Fatal(err)
			}
			cons, err := newClient([]string{broker.Addr()}, kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				b.Fatal(err)
			}
			defer cons.Close()
			cpu0 := cpuTime()
			events := 0
			for b.Loop() {
				for _, v := range values {
					prod.Produce(ctx, &kgo.Record{Topic: "orders", Value: v}, nil)
				}
				if err := prod.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				for got := 0; got < len(values); {
					f := cons.PollFetches(ctx)
					if err := f.Err(); err != nil {
						b.Fatal(err)
					}
					got += f.NumRecords()
				}
				events += len(values)
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(events), "cpu-ns/event")
			b.ReportMetric(float64(diskBytes(b, dir))/float64(events), "disk-B/event")
		})
	}
}

// demoOrders is n envelopes of inserts and updates of orders, shaped and
// varied as the demo's are.
func demoOrders(n int) [][]byte {
	t := demo.OrdersTable()
	env := change.Envelope{Name: "lakeflow", Database: "shop"}
	statuses := []string{"pending", "paid", "shipped", "delivered", "cancelled"}
	text := func(s string) change.Datum { return change.Datum{Text: []byte(s)} }
	out := make([][]byte, n)
	for i := range out {
		id := 1_000_000 + i*7919%n
		at := time.Date(2026, 11, 1+i%28, i%24, i%60, i%60, i*1013%1_000_000*1000, time.UTC)
		img := func(status string) []change.Datum {
			return []change.Datum{text(strconv.Itoa(id)), text(strconv.Itoa(id % 9973)), text(status),
				text(strconv.Itoa(1000 + id*37%90000)), text("EUR"), text(at.Format("2006-01-02 15:04:05.999999-07")),
				text(at.Add(time.Duration(i%3600) * time.Second).Format("2006-01-02 15:04:05.999999-07"))}
		}
		ev := change.Event{Table: t, Op: change.OpCreate, Pos: change.Position{Seq: change.LSN(0x1000000 + i*160), Ord: 1},
			LSN: change.LSN(0x1000000 + i*160 - 40), TxID: uint32(700 + i/8), Commit: at.UnixMicro(), Snapshot: change.SnapshotNone,
			After: img("pending")}
		if i%3 > 0 {
			ev.Op, ev.Before, ev.After = change.OpUpdate, img(statuses[i%5]), img(statuses[(i+1)%5])
		}
		v, err := env.AppendValue(nil, &ev, at.UnixMilli())
		if err != nil {
			panic(err)
		}
		out[i] = v
	}
	return out
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// diskBytes is the size of the files under dir.
func diskBytes(b *testing.B, dir string) int64 {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		b.Fatalf("size of %s: %v", dir, err)
	}
	return n
}
