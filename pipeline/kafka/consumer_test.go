package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestConsumerNeverSkipsDeletedRecords: records deleted (by a broker's
// retention) before the warehouse read them are an error naming topic,
// partition and offsets, whether the deletion is seen when the topic is
// assigned or while it is read.
func TestConsumerNeverSkipsDeletedRecords(t *testing.T) {
	brokers := fakeBroker(t)
	ctx := context.Background()
	cfg := Config{Brokers: brokers, Prefix: "lf", Partitions: 1}
	const topic = "lf.public.x"
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, -1, nil, topic); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("{}")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var del kadm.Offsets
	del.AddOffset(topic, 0, 7, -1)
	if _, err := adm.DeleteRecords(ctx, del); err != nil {
		t.Fatal(err)
	}

	cons, err := NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	_, _, err = cons.Assign(ctx, topic, 1, Position{Next: map[int32]int64{0: 2}}, false)
	if err == nil || !strings.Contains(err.Error(), "lf.public.x/0 starts at offset 7 but the warehouse has read only up to 2") {
		t.Fatalf("assigning past deleted records: %v", err)
	}

	// The same deletion seen only when fetching (it happened after the
	// assignment was checked).
	late, err := NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	late.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(2)}})
	late.next[topic] = map[int32]int64{0: 2}
	recs, err := late.Poll(ctx, 10, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "lf.public.x/0") {
		t.Fatalf("fetching past deleted records returned %d records and %v", len(recs), err)
	}
}

// TestAPausedPartitionIsNotBehind: a partition the caller paused holds
// records Poll will not return until it is resumed; Behind, which
// callers wait on before closing a batch, must not count it (a drain
// waited on one for ever), and counts it again once resumed.
func TestAPausedPartitionIsNotBehind(t *testing.T) {
	brokers := fakeBroker(t)
	ctx := context.Background()
	cfg := Config{Brokers: brokers, Prefix: "lf", Partitions: 1}
	const topic = "lf.public.y"
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, nil, topic); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("{}")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	if _, _, err := cons.Assign(ctx, topic, 1, Position{Next: map[int32]int64{0: 0}}, false); err != nil {
		t.Fatal(err)
	}
	var got int
	for got == 0 {
		recs, err := cons.Poll(ctx, 3, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got += len(recs)
	}
	if got >= 10 || !cons.Behind() {
		t.Fatalf("after taking %d of 10 records: behind %v, want true", got, cons.Behind())
	}
	tp := TopicPartition{Topic: topic, Partition: 0}
	cons.Pause(map[TopicPartition]bool{tp: true})
	if cons.Behind() {
		t.Fatal("a paused partition counts as behind: a caller waiting for it to catch up waits for ever")
	}
	cons.Pause(nil)
	if !cons.Behind() {
		t.Fatal("a resumed partition with records left does not count as behind")
	}
}
