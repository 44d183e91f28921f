package demo

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/lakeflow/lakeflow/catalog"
	"github.com/lakeflow/lakeflow/contracts"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/sql/gold"
)

// Init makes dir a lakeflow project of its own: config (lakeflow.toml,
// the binary's copy of the repository's) and the demo's contracts/,
// catalog/ and sql/gold/, all carried in the binary, so that a lakeflow
// installed with go install needs no checkout. A file that exists is
// left as it is. It returns the files written and those kept, relative
// to dir.
func Init(dir string, config []byte) (written, kept []string, err error) {
	files := map[string][]byte{"lakeflow.toml": config}
	for _, src := range []struct {
		fsys fs.FS
		dir  string
	}{{contracts.Demo, "contracts"}, {catalog.Demo, "catalog"}, {gold.Demo, filepath.Join("sql", "gold")}} {
		err := fs.WalkDir(src.fsys, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := fs.ReadFile(src.fsys, path)
			files[filepath.Join(src.dir, path)] = data
			return err
		})
		if err != nil {
			return nil, nil, err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		path := filepath.Join(dir, name)
		if _, err := os.Lstat(path); err == nil {
			kept = append(kept, name)
			continue
		} else if !errors.Is(err, os.ErrNotExist) {
			return written, kept, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
		}
		if err := writeNew(path, files[name]); err != nil {
			return written, kept, fmt.Errorf("%w: write %s: %v", fault.ErrEnvironment, path, err)
		}
		written = append(written, name)
	}
	return written, kept, nil
}

// writeNew writes a file under another name first, so that one cut short
// is not taken for the project's own next time.
func writeNew(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".writing"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
