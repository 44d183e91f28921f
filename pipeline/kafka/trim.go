package kafka

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Trim applies kafka.retention and kafka.retention_bytes to topics,
// deleting only records the warehouse has committed (below committed):
// a record goes once it is older than the retention, or once its
// partition holds more than retention_bytes. The last record of every
// partition stays, so a partition never looks empty (the source reads its
// position from it, and the embedded broker restarts an emptied partition
// at offset 0). Topics keep no retention of their own for the same
// reason: the broker would delete what the warehouse has not read.
func (c *Consumer) Trim(ctx context.Context, committed map[string]map[int32]int64) (deleted int64, err error) {
	var topics []string
	for t := range committed {
		topics = append(topics, t)
	}
	if len(topics) == 0 {
		return 0, nil
	}
	start, end, err := offsets(ctx, c.adm, topics...)
	if err != nil {
		return 0, err
	}
	aged, err := c.adm.ListOffsetsAfterMilli(ctx, time.Now().Add(-c.cfg.Retention).UnixMilli(), topics...)
	if err != nil {
		return 0, unavailable("list offsets by time", err)
	}
	sizes, err := c.adm.DescribeAllLogDirs(ctx, nil)
	if err != nil {
		return 0, unavailable("describe log dirs", err)
	}
	size := map[string]map[int32]int64{}
	for _, ds := range sizes {
		ds.EachPartition(func(d kadm.DescribedLogDirPartition) {
			if size[d.Topic] == nil {
				size[d.Topic] = map[int32]int64{}
			}
			size[d.Topic][d.Partition] = max(size[d.Topic][d.Partition], d.Size)
		})
	}
	var del kadm.Offsets
	for topic, parts := range committed {
		for p, next := range parts {
			s, ok1 := start.Lookup(topic, p)
			e, ok2 := end.Lookup(topic, p)
			if !ok1 || !ok2 {
				continue
			}
			to := min(next, e.Offset-1)
			if size[topic][p] <= c.cfg.RetentionBytes {
				if a, ok := aged.Lookup(topic, p); ok {
					to = min(to, a.Offset)
				}
			}
			if to > s.Offset {
				del.AddOffset(topic, p, to, -1)
				deleted += to - s.Offset
			}
		}
	}
	if len(del) == 0 {
		return 0, nil
	}
	resp, err := c.adm.DeleteRecords(ctx, del)
	if err == nil {
		resp.Each(func(r kadm.DeleteRecordsResponse) { err = errors.Join(err, r.Err) })
	}
	if err != nil {
		return 0, unavailable("delete records", err)
	}
	return deleted, nil
}
