package main

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/lakeflow/lakeflow/pipeline/fault"
)

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, exitOK},
		{fmt.Errorf("%w: bad key", fault.ErrConfig), exitConfig},
		{fmt.Errorf("start: %w", fmt.Errorf("%w: no initdb", fault.ErrEnvironment)), exitEnvironment},
		{fmt.Errorf("%w: kafka down", fault.ErrUnavailable), exitEnvironment},
		{fmt.Errorf("%w: no replication", fault.ErrSource), exitEnvironment},
		{errors.Join(context.Canceled, fmt.Errorf("%w: column dropped", fault.ErrSchemaBreak)), exitCheck},
		{errors.New("bug"), exitInternal},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if got := oneLine("Conversion Error: x\n\nLINE 1: SELECT\n   ^"); got != "Conversion Error: x LINE 1: SELECT ^" {
		t.Errorf("oneLine: %q", got)
	}
}
