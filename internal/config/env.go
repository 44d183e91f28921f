package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/lakeflow/lakeflow/internal/fault"
)

const envPrefix = "LAKEFLOW_"

// applyEnv overrides file values with LAKEFLOW_<SECTION>_<KEY> variables
// (LAKEFLOW_DATA_DIR for top-level keys), and returns which variable set
// each key it set (section.key), for problems to name. Lists are
// comma-separated. A LAKEFLOW_ variable that names no key is an error: a
// typo must not be silently ignored.
func applyEnv(f *file, environ []string) (map[string]string, error) {
	fields := envFields(reflect.ValueOf(f).Elem(), "", "")
	set := map[string]string{}
	var problems []string
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) {
			continue
		}
		field, ok := fields[strings.TrimPrefix(name, envPrefix)]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s names no config key%s", name, fault.DidYouMean(name, envNames(fields))))
			continue
		}
		if err := setField(field.value, val); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
		}
		set[field.key] = name
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return set, nil
}

// envNames are the variables that name a key.
func envNames(fields map[string]envField) []string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, envPrefix+k)
	}
	sort.Strings(names) // (a tie goes to the same name every time)
	return names
}

// envField is a settable field and its key (section.key).
type envField struct {
	value reflect.Value
	key   string
}

// envFields maps SECTION_KEY (upper case) to the settable field.
func envFields(v reflect.Value, prefix, section string) map[string]envField {
	out := map[string]envField{}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("toml")
		key := strings.ToUpper(tag)
		if t.Field(i).Type.Kind() == reflect.Struct {
			for k, f := range envFields(v.Field(i), prefix+key+"_", section+tag+".") {
				out[k] = f
			}
			continue
		}
		out[prefix+key] = envField{v.Field(i), section + tag}
	}
	return out
}

func setField(f reflect.Value, val string) error {
	switch f.Kind() {
	case reflect.String:
		f.SetString(val)
	case reflect.Int:
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("%q is not an integer", val)
		}
		f.SetInt(int64(n))
	case reflect.Map:
		// name=value pairs, comma-separated.
		m := map[string]string{}
		for _, s := range strings.Split(val, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			k, v, ok := strings.Cut(s, "=")
			if !ok {
				return fmt.Errorf("%q: want name=value pairs, comma-separated", val)
			}
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
		f.Set(reflect.ValueOf(m))
	case reflect.Slice:
		var items []string
		for _, s := range strings.Split(val, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
		f.Set(reflect.ValueOf(items))
	default:
		return fmt.Errorf("unsupported kind %s", f.Kind())
	}
	return nil
}

// Keys are every key lakeflow.toml takes (section.key; a table of
// entries, such as gold.refresh, by its name), sorted.
func Keys() []string {
	var f file
	fields := envFields(reflect.ValueOf(&f).Elem(), "", "")
	keys := make([]string, 0, len(fields))
	for _, field := range fields {
		keys = append(keys, field.key)
	}
	sort.Strings(keys)
	return keys
}
