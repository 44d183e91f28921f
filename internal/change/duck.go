package change

import (
	"fmt"
	"strings"
)

// DuckDB is the DuckDB type that holds the type's values in silver:
// faithful where DuckDB has the type (unconstrained numeric stays exact as
// text; money spans 19 digits), one level of list per array dimension,
// and text for anything DuckDB has no type for.
func (t Type) DuckDB() string {
	return t.scalarDuckDB() + strings.Repeat("[]", t.Dims)
}

func (t Type) scalarDuckDB() string {
	switch t.Kind {
	case KindInt2:
		return "SMALLINT"
	case KindInt4:
		return "INTEGER"
	case KindInt8:
		return "BIGINT"
	case KindFloat4:
		return "FLOAT"
	case KindFloat8:
		return "DOUBLE"
	case KindNumeric:
		if t.Precision > 0 {
			return fmt.Sprintf("DECIMAL(%d,%d)", t.Precision, t.Scale)
		}
	case KindMoney:
		return "DECIMAL(19,2)"
	case KindBool:
		return "BOOLEAN"
	case KindBytea:
		return "BLOB"
	case KindDate:
		return "DATE"
	case KindTime:
		return "TIME"
	case KindTimeTZ:
		return "TIMETZ"
	case KindTimestamp:
		return "TIMESTAMP"
	case KindTimestampTZ:
		return "TIMESTAMPTZ"
	case KindInterval:
		return "INTERVAL"
	case KindUUID:
		return "UUID"
	case KindJSON, KindJSONB:
		return "JSON"
	}
	return "VARCHAR"
}
