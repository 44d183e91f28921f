// Package build names the lakeflow being run: for --version, and for what
// a state checkpoint records of the lakeflow that wrote it.
package build

import (
	"fmt"
	"os"
	"runtime/debug"
	"sync"
)

// Version is the module's version, or for a build from a checkout the
// commit it was built from (+dirty with changes not committed).
func Version() string {
	v, _ := version()
	return v
}

// version also says whether the version leaves builds apart: not for a
// checkout with changes, nor when none is known.
func version() (string, bool) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown", false
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v, true
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = true
		}
	}
	switch {
	case rev == "":
		return "(devel)", false
	case dirty:
		return rev + "+dirty", false
	}
	return rev, true
}

// Identity tells this build from any other: its version, and where that
// does not (a checkout with changes, a test binary) the executable's size
// and time, which change with every build.
var Identity = sync.OnceValue(func() string {
	v, exact := version()
	if exact {
		return v
	}
	if exe, err := os.Executable(); err == nil {
		if fi, err := os.Stat(exe); err == nil {
			v += fmt.Sprintf("@%d.%d", fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return v
})
