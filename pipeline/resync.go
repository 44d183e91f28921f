package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/postgres"
)

// A resync is asked for with a file in data_dir/requests: a running
// pipeline looks there every second, a stopped one at its next start, and
// removes the file once the source's state schedules the copies (so a
// crash in between asks again, which copies the tables once more).
const requestsDir = "requests"

// resyncRequest is a request file's content.
type resyncRequest struct {
	// Tables are qualified names; empty: every captured table.
	Tables []string `json:"tables,omitempty"`
	All    bool     `json:"all,omitempty"`
}

// RequestResync asks for tables (source.tables entries) to be copied
// again, or with all every captured table; it returns their qualified
// names (none for all) and whether a pipeline runs on the data directory
// (it takes the request within a second; otherwise the next lakeflow run
// does).
func RequestResync(cfg *config.Config, tables []string, all bool) (names []string, running bool, err error) {
	req := resyncRequest{All: all}
	if all == (len(tables) > 0) {
		return nil, false, fmt.Errorf("%w: name the tables to resync, or --all", fault.ErrConfig)
	}
	for _, name := range tables {
		t, err := config.ParseTable(name)
		if err != nil {
			return nil, false, fmt.Errorf("%w: %v", fault.ErrConfig, err)
		}
		if !slices.Contains(cfg.Source.Tables, t) {
			return nil, false, fmt.Errorf("%w: table %s is not in source.tables%s (%s)", fault.ErrConfig, t, fault.DidYouMean(t.String(), tableNames(cfg.Source.Tables)), strings.Join(tableNames(cfg.Source.Tables), ", "))
		}
		req.Tables = append(req.Tables, t.String())
	}
	dir := filepath.Join(cfg.DataDir, requestsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, false, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, false, err
	}
	name := filepath.Join(dir, "resync-"+strconv.FormatInt(time.Now().UnixNano(), 10)+".json")
	if err := os.WriteFile(name+".tmp", b, 0o644); err != nil {
		return nil, false, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	if err := os.Rename(name+".tmp", name); err != nil {
		return nil, false, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
	}
	return req.Tables, dataDirLocked(cfg.DataDir), nil
}

// tableNames are the names of tables as source.tables spells them.
func tableNames(tables []config.Table) []string {
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.String()
	}
	return names
}

// resyncWatch hands the source the request files of data_dir/requests.
type resyncWatch struct {
	dir  string
	log  *slog.Logger
	mu   sync.Mutex
	sent map[string]bool
}

func newResyncWatch(dataDir string, log *slog.Logger) *resyncWatch {
	return &resyncWatch{dir: filepath.Join(dataDir, requestsDir), log: log, sent: map[string]bool{}}
}

type pendingResync struct {
	path string
	req  resyncRequest
}

// pending reads the request files not handed over yet, oldest first, and
// marks them handed over.
func (w *resyncWatch) pending() []pendingResync {
	w.mu.Lock()
	defer w.mu.Unlock()
	names, _ := filepath.Glob(filepath.Join(w.dir, "resync-*.json"))
	slices.Sort(names)
	var out []pendingResync
	for _, name := range names {
		if w.sent[name] {
			continue
		}
		b, err := os.ReadFile(name)
		var req resyncRequest
		if err == nil {
			err = json.Unmarshal(b, &req)
		}
		if err != nil {
			w.log.Warn("a resync request that cannot be read is set aside", "file", name, "err", err)
			os.Rename(name, name+".bad")
			continue
		}
		w.sent[name] = true
		out = append(out, pendingResync{path: name, req: req})
	}
	return out
}

// done removes a request the source has scheduled.
func (w *resyncWatch) done(path string) func() {
	return func() {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			w.log.Warn("a resync request done stays", "file", path, "err", err)
		}
	}
}

// initial hands over the requests made while no pipeline ran, before the
// source starts: a buffered channel the source empties before anything
// else, so a run that drains the WAL copies them first.
func (w *resyncWatch) initial() chan postgres.Resync {
	reqs := w.pending()
	out := make(chan postgres.Resync, len(reqs)+1)
	for _, p := range reqs {
		out <- postgres.Resync{Tables: p.req.Tables, Accepted: w.done(p.path)}
	}
	return out
}

// watch hands over the requests made from now on, every second until ctx
// ends.
func (w *resyncWatch) watch(ctx context.Context, out chan<- postgres.Resync) {
	eachSecond(ctx, func() bool {
		for _, p := range w.pending() {
			select {
			case out <- postgres.Resync{Tables: p.req.Tables, Accepted: w.done(p.path)}:
			case <-ctx.Done():
				return false
			}
		}
		return true
	})
}
