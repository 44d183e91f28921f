package pipeline

import (
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/internal/change"
)

func TestDriftFindings(t *testing.T) {
	tb := &change.Table{Name: "orders", Columns: []change.Column{{Name: "id"}, {Name: "coupon"}, {Name: "status"}}}
	before := dayStats{n: 100, nonNull: []int64{100, 90, 100}, distinct: []int64{100, 30, 5}}
	last := dayStats{n: 100, nonNull: []int64{100, 20, 100}, distinct: []int64{100, 8, 60}}
	var got []string
	for _, f := range driftFindings(tb, "silver.orders", last, before) {
		got = append(got, f.Check+" "+f.Severity)
	}
	if strings.Join(got, ", ") != "orders.coupon.null_rate error, orders.status.distinct warning" {
		t.Errorf("findings %v", got)
	}
	if f := driftFindings(tb, "silver.orders", dayStats{n: 5, nonNull: []int64{5, 0, 5}, distinct: []int64{5, 0, 1}}, before); f != nil {
		t.Errorf("a day of 5 changes is judged: %v", f)
	}
}
