package warehouse

/*
#include <stddef.h>
#include <stdint.h>

// DuckDB's library links jemalloc with its symbols prefixed duckdb_je_.
// Weak: a build of DuckDB without it still links, and the purge is a no-op.
extern int duckdb_je_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) __attribute__((weak));

// lakeflow_purge purges every arena once the pages jemalloc holds freed
// (resident, not active) pass threshold bytes; -1 if it cannot look.
static int lakeflow_purge(size_t threshold) {
	if (duckdb_je_mallctl == NULL) {
		return -1;
	}
	uint64_t epoch = 1;
	size_t len = sizeof(epoch);
	size_t resident = 0, active = 0, n = sizeof(size_t);
	if (duckdb_je_mallctl("epoch", &epoch, &len, &epoch, len) != 0 ||
		duckdb_je_mallctl("stats.resident", &resident, &n, NULL, 0) != 0 ||
		duckdb_je_mallctl("stats.active", &active, &n, NULL, 0) != 0) {
		return -1;
	}
	if (resident < active + threshold) {
		return 0;
	}
	// 4096 is MALLCTL_ARENAS_ALL: every arena.
	return duckdb_je_mallctl("arena.4096.purge", NULL, NULL, NULL, 0) == 0 ? 0 : -1;
}
*/
import "C"

// purgeAllocator has DuckDB's allocator return the pages it holds freed
// to the system once they pass 64 MiB. DuckDB configures jemalloc to keep
// freed pages for 5 s (and offers no SQL setting for it), so after a
// backlog batch RSS kept 150-250 MB more than DuckDB used, until the next
// batch reused or the decay returned them; purging once a batch has
// committed keeps the peak at what one batch needs. A replay of 610,923
// events: peak RSS 706 / 673 / 650 MiB -> 569 / 555 / 576 MiB, wall +3%
// (the next batch faults the pages in again). The small batches of a
// steady stream free less than the threshold and pay nothing. It reports
// whether it could look (false: no jemalloc in DuckDB's library).
func purgeAllocator() bool { return C.lakeflow_purge(purgeThreshold) >= 0 }

// purgeThreshold is how many freed bytes the allocator may hold after a
// batch.
const purgeThreshold = 64 << 20
