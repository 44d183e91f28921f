package warehouse

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/lake"
)

// TestTodaysMergedFilesMergeByTier: a running pipeline's pass merges
// today's small files, and today's merged files only four or more of one
// tier in a row; a day before today merges all of them.
func TestTodaysMergedFilesMergeByTier(t *testing.T) {
	f := newFixture(t)
	defer f.close()
	const day = "2024-02-29"
	var parts []lake.Part
	meta := map[string]map[string]string{}
	// Merged files of 1 MiB (tier 1) and 8 MiB (tier 2), then small ones,
	// in position order.
	add := func(size int64, merged bool) {
		n := len(parts)
		p := lake.Part{Path: filepath.Join("acct", "date="+day, fmt.Sprintf("part-%03d.parquet", n)), Day: day, Span: lake.Span{MinSeq: change.LSN(100 * (n + 1))}}
		abs := f.wh.lake.Abs(p.Path)
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(abs, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(abs, size); err != nil {
			t.Fatal(err)
		}
		meta[abs] = map[string]string{metaTopic: topic, metaTopicID: "x", metaSchema: "s"}
		if merged {
			meta[abs][metaBatches] = "_batches"
		}
		parts = append(parts, p)
	}
	for range 2 {
		add(8<<20, true)
	}
	for range 5 {
		add(1<<20, true)
	}
	for range 3 {
		add(8<<20, true)
	}
	for range 3 {
		add(10<<10, false)
	}
	bins := func(today bool) (out [][]int) {
		bs, err := f.wh.binDay(parts, meta, dayPlan{target: 128 << 20, today: today})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			var idx []int
			for _, p := range b.files {
				idx = append(idx, slices.IndexFunc(parts, func(q lake.Part) bool { return q.Path == p.Path }))
			}
			out = append(out, idx)
		}
		return out
	}
	if got, want := fmt.Sprint(bins(true)), "[[2 3 4 5 6] [10 11 12]]"; got != want {
		t.Errorf("today's bins %s, want %s: the five tier-1 merged files, and the small ones (two and three tier-2 files wait for four)", got, want)
	}
	if got, want := fmt.Sprint(bins(false)), "[[0 1 2 3 4 5 6 7 8 9 10 11 12]]"; got != want {
		t.Errorf("a past day's bins %s, want %s", got, want)
	}
}
