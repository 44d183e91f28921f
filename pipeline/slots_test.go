package pipeline

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/postgres/pgtest"
)

// TestInactiveSlotsAreReported: a replication slot no one reads holds WAL
// for ever; status and check name it with the statement that drops it,
// and a new source.slot drops the slot it replaces.
func TestInactiveSlotsAreReported(t *testing.T) {
	h := newHarness(t, "public.t")
	pgtest.Exec(t, h.dsn, `CREATE TABLE t (id int PRIMARY KEY, v int)`, `INSERT INTO t VALUES (1, 1)`)
	h.run(t, Options{})
	stray := "stray_" + h.cfg.Source.Slot
	pgtest.Exec(t, h.dsn, `SELECT pg_create_logical_replication_slot('`+stray+`', 'pgoutput')`, `INSERT INTO t VALUES (2, 2)`)

	out, err := withStderr(lakeflowCmd(t, "--config", h.file, "status", "--json").Output())
	if err != nil {
		t.Fatalf("lakeflow status: %v: %s", err, out)
	}
	var st StatusReport
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.InactiveSlots) != 1 || st.InactiveSlots[0].Name != stray || st.InactiveSlots[0].RetainedBytes <= 0 {
		t.Errorf("status reports inactive slots %+v, want %s holding WAL", st.InactiveSlots, stray)
	}
	out, _ = lakeflowCmd(t, "--config", h.file, "status").Output()
	if !strings.Contains(string(out), "SELECT pg_drop_replication_slot('"+stray+"')") {
		t.Errorf("status does not say how to drop the slot:\n%s", out)
	}
	r, err := Check(context.Background(), h.cfg, PartContracts, h.log)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range r.Findings {
		found = found || f.Check == "source.inactive_slot" && f.Dataset == stray && strings.Contains(f.Fix, "pg_drop_replication_slot")
	}
	if !found {
		t.Errorf("check finds %+v, want the inactive slot %s", r.Findings, stray)
	}

	// A new source.slot takes every table again and drops the old slot.
	old := h.cfg.Source.Slot
	h.cfg.Source.Slot += "_2"
	h.run(t, Options{})
	conn := pgtest.Connect(t, h.dsn)
	defer conn.Close(context.Background())
	var left int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", old).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("the slot %s the new source.slot replaced is still there", old)
	}
	assertSilverEqualsSource(t, h.dsn, h.cfg.Warehouse.Path, "public.t")
}
