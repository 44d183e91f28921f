package contracts

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// typeNames maps PostgreSQL's names of built-in types (as format_type
// spells them, and their common aliases) to kinds.
var typeNames = map[string]change.Kind{
	"smallint": change.KindInt2, "int2": change.KindInt2,
	"integer": change.KindInt4, "int": change.KindInt4, "int4": change.KindInt4,
	"bigint": change.KindInt8, "int8": change.KindInt8,
	"real": change.KindFloat4, "float4": change.KindFloat4,
	"double precision": change.KindFloat8, "float8": change.KindFloat8,
	"numeric": change.KindNumeric, "decimal": change.KindNumeric,
	"money": change.KindMoney, "boolean": change.KindBool, "bool": change.KindBool,
	"text": change.KindText, "character varying": change.KindText, "varchar": change.KindText,
	"character": change.KindText, "char": change.KindText, "bpchar": change.KindText, "name": change.KindText,
	"citext": change.KindText, "bytea": change.KindBytea, "date": change.KindDate,
	"time without time zone": change.KindTime, "time": change.KindTime,
	"time with time zone": change.KindTimeTZ, "timetz": change.KindTimeTZ,
	"timestamp without time zone": change.KindTimestamp, "timestamp": change.KindTimestamp,
	"timestamp with time zone": change.KindTimestampTZ, "timestamptz": change.KindTimestampTZ,
	"interval": change.KindInterval, "uuid": change.KindUUID, "json": change.KindJSON, "jsonb": change.KindJSONB,
	"inet": change.KindOther, "cidr": change.KindOther, "macaddr": change.KindOther, "xml": change.KindOther,
	"tsvector": change.KindOther, "point": change.KindOther,
}

var typeMods = regexp.MustCompile(`^([a-z ]+?)\s*(?:\((\d+)(?:\s*,\s*(\d+))?\))?(\s+with(?:out)? time zone)?$`)

// ParseType reads a column type as PostgreSQL spells it (format_type:
// "numeric(12,2)", "character varying(20)", "timestamp with time zone",
// "integer[]"). A type that is not built in (an enum, a domain, an
// extension's type) is named by base: the built-in type it is stored as.
func ParseType(name, base string) (change.Type, error) {
	t := change.Type{Name: name}
	s := strings.ToLower(strings.TrimSpace(name))
	for strings.HasSuffix(s, "[]") {
		s = strings.TrimSpace(strings.TrimSuffix(s, "[]"))
		t.Dims++
	}
	m := typeMods.FindStringSubmatch(s)
	if m == nil {
		return t, fmt.Errorf("%q is not a PostgreSQL type name", name)
	}
	kind, ok := typeNames[strings.TrimSpace(m[1]+m[4])]
	if !ok {
		if base == "" {
			return t, fmt.Errorf("type %q is not built in: say which built-in type it is stored as with base = \"text\" (for an enum), or the domain's base type", name)
		}
		bt, err := ParseType(base, "")
		if err != nil {
			return t, fmt.Errorf("base of %q: %w", name, err)
		}
		bt.Name, bt.Dims = name, bt.Dims+t.Dims
		return bt, nil
	}
	t.Kind = kind
	p, _ := strconv.Atoi(m[2])
	sc, _ := strconv.Atoi(m[3])
	switch {
	case kind == change.KindNumeric && m[2] != "":
		if p < 1 || p > 1000 || sc > p {
			return t, fmt.Errorf("%q: bad numeric precision or scale", name)
		}
		if p <= 38 {
			t.Precision, t.Scale = p, sc
		}
	case strings.HasPrefix(m[1], "character varying") || m[1] == "varchar":
		t.Length = p
	case m[1] == "character" || m[1] == "char" || m[1] == "bpchar":
		t.Fixed, t.Length = true, max(p, 1)
	}
	return t, nil
}
