package warehouse

/*
#include <stddef.h>

// DuckDB's library links jemalloc with its symbols prefixed duckdb_je_.
// Weak: a build of DuckDB without it still links, and the purge is a no-op.
extern int duckdb_je_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) __attribute__((weak));

static int lakeflow_purge(void) {
	if (duckdb_je_mallctl == NULL) {
		return -1;
	}
	// 4096 is MALLCTL_ARENAS_ALL: every arena.
	return duckdb_je_mallctl("arena.4096.purge", NULL, NULL, NULL, 0);
}
*/
import "C"

// purgeAllocator has DuckDB's allocator return the pages it holds freed
// to the system. DuckDB configures jemalloc to keep freed pages for 5 s
// (and offers no SQL setting for it), so after a backlog batch RSS kept
// 150-250 MB more than DuckDB used, until the next batch reused or the
// decay returned them; purging once a batch has committed keeps the peak
// at what one batch needs. A replay of 610,923 events: peak RSS 706 / 673
// / 650 MiB -> 569 / 555 / 576 MiB, wall +3% (the next batch faults the
// pages in again). It reports whether it could.
func purgeAllocator() bool { return C.lakeflow_purge() == 0 }
