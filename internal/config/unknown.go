package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/lakeflow/lakeflow/internal/fault"
)

// unknownKeys names each key of a TOML file that v has no field for, with
// its line and, where a typo explains it, the key meant.
func unknownKeys(path string, strict *toml.StrictMissingError, v any) string {
	msgs := make([]string, 0, len(strict.Errors))
	for _, e := range strict.Errors {
		row, _ := e.Position()
		key := e.Key()
		msgs = append(msgs, fmt.Sprintf("%s:%d: unknown key %s%s", path, row, strings.Join(key, "."), meant(reflect.TypeOf(v), key)))
	}
	return strings.Join(msgs, "; ")
}

// meant follows key down t's fields (by their toml names) to the first
// part t does not know, and suggests the known name a typo there explains.
func meant(t reflect.Type, key []string) string {
	for i, part := range key {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return ""
		}
		known := tomlFields(t)
		next, ok := known[part]
		if !ok {
			names := make([]string, 0, len(known))
			for name := range known {
				names = append(names, strings.Join(append(key[:i:i], name), "."))
			}
			slices.Sort(names) // (a tie goes to the same name every time)
			return fault.DidYouMean(strings.Join(key[:i+1], "."), names)
		}
		t = next
	}
	return ""
}

// tomlFields are the types of struct t's fields by their toml names,
// those of embedded structs included.
func tomlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for _, f := range reflect.VisibleFields(t) {
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name != "" && name != "-" {
			out[name] = f.Type
		}
	}
	return out
}
