package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"

	"github.com/lakeflow/lakeflow/internal/fault"
)

// startProfile starts profiling lakeflow run into dir: cpu.pprof, its CPU
// profile, each sample labelled with the stage of the pipe it worked for
// (go tool pprof -tags cpu.pprof), and heap.pprof, written when the run
// ends (allocations over the whole run: -sample_index=alloc_space). The
// returned function stops and writes them.
func startProfile(dir string) (func() error, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: --profile %s: %v", fault.ErrConfig, dir, err)
	}
	cpu, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		return nil, fmt.Errorf("%w: --profile %s: %v", fault.ErrConfig, dir, err)
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		cpu.Close()
		return nil, fmt.Errorf("%w: --profile: %v", fault.ErrEnvironment, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := cpu.Close(); err != nil {
			return err
		}
		heap, err := os.Create(filepath.Join(dir, "heap.pprof"))
		if err != nil {
			return err
		}
		runtime.GC() // the in-use figures as of now
		if err := pprof.Lookup("heap").WriteTo(heap, 0); err != nil {
			heap.Close()
			return err
		}
		return heap.Close()
	}, nil
}
