package warehouse

import (
	"bytes"
	"database/sql/driver"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lakeflow/lakeflow/internal/change"
)

// Decoding envelopes in Go. parseSQL decodes a table's envelopes in
// DuckDB (from_json and a cast per value): about a quarter of a batch's
// CPU. A flat decoder reads an envelope in Go instead, and the Appender
// puts its values in typed columns of a flat table (lakeflow_flat_<id>),
// which one statement packs into the decoded table. It takes only the
// envelopes whose every value it can reproduce exactly as parseSQL
// would, and only those parseSQL would accept; it refuses anything else
// (not canonical, a value out of range, a dead letter), and parseSQL
// decodes what it refused, so what a batch holds never depends on which
// of the two read it. Tables with a column of a kind it does not carry
// (JSON, arrays, times with a zone) are parseSQL's
// alone.
type flatDecoder struct {
	cols []carrier
	// keys are the image keys as change.Envelope writes them, `"name":`.
	keys []string
	key  []int
	// since is where the current names took effect: a change from before
	// may spell them alike and mean other columns (a name dropped and
	// added again), so the SQL decoder, which reads each column under
	// its name at the change's position, takes it.
	since change.Position
	// row is the flat row being filled: op, has before, has after, the
	// before values, the after values, then the flat* fields.
	row []driver.Value
	// create and insert pack the flat table into the decoded table: as a
	// new table, or into the one parseSQL made of the refused envelopes.
	create, insert string
}

// The fields of a flat row after the images.
const (
	flatSeq = iota
	flatOrd
	flatCommit
	flatLSN
	flatTx
	flatPartition
	flatOffset
	flatKeyOnly
	flatFields
)

// carrier is how a column's values travel from Go to the decoded table: the
// flat column's type, how Go reads the value (false: refused), and the
// SQL that makes the lake's value of the flat column. The SQL casts, not
// tries: a value Go let through that DuckDB cannot hold fails the batch
// instead of becoming NULL.
type carrier struct {
	flat string
	read func(s *envScan) (driver.Value, bool)
	pack func(x string) string
}

// carrierOf returns the carrier of a column type, if it has one.
func carrierOf(t change.Type) (carrier, bool) {
	same := func(x string) string { return x }
	if t.Dims > 0 {
		return carrier{}, false
	}
	switch t.Kind {
	case change.KindInt2:
		return carrier{"SMALLINT", func(s *envScan) (driver.Value, bool) {
			v, ok := s.integer(-1<<15, 1<<15-1)
			return int16(v), ok
		}, same}, true
	case change.KindInt4:
		return carrier{"INTEGER", func(s *envScan) (driver.Value, bool) {
			v, ok := s.integer(-1<<31, 1<<31-1)
			return int32(v), ok
		}, same}, true
	case change.KindInt8:
		return carrier{"BIGINT", func(s *envScan) (driver.Value, bool) { return s.integer(-1<<63, 1<<63-1) }, same}, true
	case change.KindFloat8:
		return carrier{"DOUBLE", func(s *envScan) (driver.Value, bool) { return s.float(64) }, same}, true
	case change.KindFloat4:
		return carrier{"FLOAT", func(s *envScan) (driver.Value, bool) {
			f, ok := s.float(32)
			return float32(f), ok
		}, same}, true
	case change.KindBool:
		return carrier{"BOOLEAN", func(s *envScan) (driver.Value, bool) {
			if s.lit("true") {
				return true, true
			}
			return false, s.lit("false")
		}, same}, true
	case change.KindTimestampTZ:
		return carrier{"BIGINT", func(s *envScan) (driver.Value, bool) {
			text, ok := s.plain()
			if !ok {
				return nil, false
			}
			return change.ParseMicrosISO(text)
		}, func(x string) string { return "make_timestamptz(" + x + ")" }}, true
	case change.KindNumeric, change.KindMoney:
		if t.Kind == change.KindNumeric && t.Precision == 0 {
			break // text
		}
		duck := t.DuckDB()
		p, sc := t.Precision, t.Scale
		if t.Kind == change.KindMoney {
			p, sc = 19, 2
		}
		return carrier{"VARCHAR", checked(func(text []byte) bool { return decimalFits(text, p, sc) }),
			func(x string) string { return "CAST(" + x + " AS " + duck + ")" }}, true
	case change.KindDate:
		return carrier{"INTEGER", func(s *envScan) (driver.Value, bool) {
			v, ok := s.integer(minDay, maxDay)
			return int32(v), ok
		}, func(x string) string { return "CAST(DATE '1970-01-01' + " + x + " AS DATE)" }}, true
	case change.KindTimestamp:
		return carrier{"BIGINT", func(s *envScan) (driver.Value, bool) {
			return s.integer(minDay*change.MicrosPerDay, (maxDay+1)*change.MicrosPerDay-1)
		}, func(x string) string { return "make_timestamp(" + x + ")" }}, true
	case change.KindTime:
		// 24:00:00, which PostgreSQL allows, is parseSQL's.
		return carrier{"BIGINT", func(s *envScan) (driver.Value, bool) {
			return s.integer(0, change.MicrosPerDay-1)
		}, func(x string) string { return "TIME '00:00:00' + to_microseconds(" + x + ")" }}, true
	case change.KindUUID:
		return carrier{"VARCHAR", checked(isUUID), func(x string) string { return "CAST(" + x + " AS UUID)" }}, true
	case change.KindInterval:
		// The lake keeps the text; silver's lakeflow_iso_interval must
		// read it.
		return carrier{"VARCHAR", checked(isoInterval), same}, true
	case change.KindBytea:
		return carrier{"BLOB", func(s *envScan) (driver.Value, bool) {
			text, ok := s.plain()
			if !ok {
				return nil, false
			}
			b := make([]byte, base64.StdEncoding.DecodedLen(len(text)))
			n, err := base64.StdEncoding.Strict().Decode(b, text)
			return b[:n], err == nil
		}, same}, true
	}
	if t.DuckDB() == "VARCHAR" {
		return carrier{"VARCHAR", func(s *envScan) (driver.Value, bool) {
			text, esc, ok := s.str()
			if esc {
				text = unescape(text)
			}
			return string(text), ok
		}, same}, true
	}
	return carrier{}, false
}

// checked reads a string without escapes that check accepts.
func checked(check func([]byte) bool) func(*envScan) (driver.Value, bool) {
	return func(s *envScan) (driver.Value, bool) {
		text, ok := s.plain()
		return string(text), ok && check(text)
	}
}

// The days and microseconds of years 1 to 9999, which DuckDB and
// PostgreSQL both hold; dates and timestamps outside them (and their
// infinities) are parseSQL's.
const (
	minDay = -719162 // 0001-01-01
	maxDay = 2932896 // 9999-12-31
)

// decimalFits reports whether text is a plain decimal number, -?digits
// with an optional fraction, of at most p digits of which at most s
// after the point: one DECIMAL(p, s) holds without rounding.
func decimalFits(text []byte, p, s int) bool {
	if len(text) > 0 && text[0] == '-' {
		text = text[1:]
	}
	whole, frac, dot := bytes.Cut(text, []byte("."))
	if len(whole) == 0 || (dot && len(frac) == 0) || !allDigits(whole) || !allDigits(frac) || len(frac) > s {
		return false
	}
	if len(whole) > 1 && whole[0] == '0' {
		return false
	}
	if string(whole) == "0" {
		whole = nil
	}
	return len(whole) <= p-s
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// isoInterval reports whether text is an interval as PostgreSQL prints it
// in iso_8601 style (P1Y2M3DT4H5M6.5S, P-1DT-2H, PT0S) whose parts
// lakeflow_iso_interval reads without overflow: months (years × 12 +
// months) and days within 32 bits, hours and minutes too, seconds below a
// trillion with at most six decimals.
func isoInterval(text []byte) bool {
	if len(text) < 3 || text[0] != 'P' {
		return false
	}
	date, clock, timed := bytes.Cut(text[1:], []byte("T"))
	if timed && len(clock) == 0 {
		return false
	}
	part := func(s []byte, unit byte, frac bool) (int64, []byte, bool) {
		i := 0
		if i < len(s) && s[i] == '-' {
			i++
		}
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		digits := i - start
		if frac && i < len(s) && s[i] == '.' {
			i++
			f := i
			for i < len(s) && s[i] >= '0' && s[i] <= '9' {
				i++
			}
			if i == f || i-f > 6 {
				return 0, s, false
			}
		}
		if digits == 0 || digits > 12 || i >= len(s) || s[i] != unit {
			return 0, s, true // not this part
		}
		n, _ := strconv.ParseInt(string(s[:start+digits]), 10, 64)
		return n, s[i+1:], true
	}
	// Years, months, days before the T; hours, minutes, seconds after.
	var v [6]int64
	var ok bool
	rest := date
	for i, unit := range []byte("YMDHMS") {
		if i == 3 {
			if len(rest) != 0 {
				return false
			}
			rest = clock
		}
		if v[i], rest, ok = part(rest, unit, unit == 'S'); !ok {
			return false
		}
	}
	const max32 = 1<<31 - 1
	abs := func(v int64) int64 { return max(v, -v) }
	return len(rest) == 0 && abs(v[0]) <= max32/12 && abs(v[0]*12+v[1]) <= max32 && abs(v[1]) <= max32 && abs(v[2]) <= max32 &&
		abs(v[3]) <= max32 && abs(v[4]) <= max32 && abs(v[5]) < 1e12
}

// isUUID reports whether text is a UUID as PostgreSQL prints it: 8-4-4-4-12
// lower-case hexadecimal digits.
func isUUID(text []byte) bool {
	if len(text) != 36 {
		return false
	}
	for i, c := range text {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// newFlatDecoder returns the flat decoder of table id, or nil if a column
// has no carrier.
func newFlatDecoder(id int, topic string, t *change.Table) *flatDecoder {
	d := &flatDecoder{key: t.KeyColumns()}
	for _, f := range slices.Concat(t.Formerly, t.Reals) {
		if d.since.Less(f.Before) {
			d.since = f.Before
		}
	}
	for _, c := range t.Columns {
		ct, ok := carrierOf(c.Type)
		if !ok {
			return nil
		}
		d.cols = append(d.cols, ct)
		d.keys = append(d.keys, string(append(change.AppendString(nil, c.Name), ':')))
	}
	d.row = make([]driver.Value, 3+2*len(d.cols)+flatFields)
	pack := func(side string, first int) string {
		fields := make([]string, len(t.Columns))
		for i, c := range t.Columns {
			fields[i] = ident(c.Name) + " := " + d.cols[i].pack(fmt.Sprintf("v%d", first+i))
		}
		for _, c := range t.Retired {
			// It reads only envelopes of the current columns: made after
			// the drop.
			fields = append(fields, ident(c.Name)+" := CAST(NULL AS "+lakeType(c.Type)+")")
		}
		return fmt.Sprintf("CASE WHEN has_%[1]s THEN struct_pack(%[2]s) END AS %[1]s", side, strings.Join(fields, ", "))
	}
	sel := fmt.Sprintf(`SELECT chr(op) AS op, %s, %s, _cdc_seq, _cdc_ord, make_timestamptz(commit_us) AS _commit_ts, lsn, tx_id,
	%s AS kafka_topic, kafka_partition, kafka_offset, CAST(make_timestamptz(commit_us) AS DATE) AS day, key_only, CAST(NULL AS VARCHAR) AS dlq_reason,
	CAST(NULL AS VARCHAR[]) AS unchanged
FROM %s`, pack("before", 0), pack("after", len(t.Columns)), literal(topic), flatTable(id))
	d.create = fmt.Sprintf("CREATE OR REPLACE TABLE %s AS %s", decodedTable(id), sel)
	d.insert = fmt.Sprintf("INSERT INTO %s %s", decodedTable(id), sel)
	return d
}

// flatTable is the staging table the Appender fills with a table's
// envelopes decoded in Go (flatName, in the staging database).
func flatTable(id int) string { return scratchDB + "." + flatName(id) }

func flatName(id int) string { return fmt.Sprintf("lakeflow_flat_%d", id) }

// ddl is the flat table's column list.
func (d *flatDecoder) ddl() string {
	cols := []string{"op UTINYINT", "has_before BOOLEAN", "has_after BOOLEAN"}
	for i := range 2 * len(d.cols) {
		cols = append(cols, fmt.Sprintf("v%d %s", i, d.cols[i%len(d.cols)].flat))
	}
	cols = append(cols, "_cdc_seq UBIGINT", "_cdc_ord UINTEGER", "commit_us BIGINT", "lsn UBIGINT", "tx_id UBIGINT",
		"kafka_partition INTEGER", "kafka_offset BIGINT", "key_only BOOLEAN")
	return strings.Join(cols, ", ")
}

// Which top-level fields an envelope had, to refuse one that repeats a
// field (which of the two from_json would take is its business).
const (
	seenBefore = 1 << iota
	seenAfter
	seenSource
	seenOp
	seenSeq
	seenOrd
	seenCommit
	seenKeyOnly
	seenTx
	seenLSN
)

// decode reads envelope v into d.row, reporting false if it refuses it.
func (d *flatDecoder) decode(v []byte) bool {
	s := envScan{b: v}
	row := d.row
	n := len(d.cols)
	meta := row[3+2*n:]
	row[1], row[2], meta[flatLSN], meta[flatTx], meta[flatKeyOnly] = false, false, nil, nil, false
	var seen int
	mark := func(f int) bool {
		dup := seen&f != 0
		seen |= f
		return !dup
	}
	name, more, ok := s.member(true)
	for ; ok && more; name, more, ok = s.member(false) {
		switch string(name) {
		case "before":
			if !mark(seenBefore) || !d.image(&s, row, 1, 3) {
				return false
			}
		case "after":
			if !mark(seenAfter) || !d.image(&s, row, 2, 3+n) {
				return false
			}
		case "source":
			if !mark(seenSource) || !d.source(&s, meta, &seen) {
				return false
			}
		case "op":
			op, _, ok := s.str()
			if !mark(seenOp) || !ok || len(op) != 1 || !strings.ContainsRune("cudrtm", rune(op[0])) {
				return false
			}
			row[0] = op[0]
		case "_cdc_seq":
			u, ok := s.uinteger(1<<64 - 1)
			if !mark(seenSeq) || !ok {
				return false
			}
			meta[flatSeq] = u
		case "_cdc_ord":
			u, ok := s.uinteger(1<<32 - 1)
			if !mark(seenOrd) || !ok {
				return false
			}
			meta[flatOrd] = uint32(u)
		case "_commit_ts":
			text, ok := s.plain()
			if !mark(seenCommit) || !ok {
				return false
			}
			if meta[flatCommit], ok = change.ParseMicrosISO(text); !ok {
				return false
			}
		case "_before_key_only":
			if !mark(seenKeyOnly) {
				return false
			}
			switch {
			case s.lit("true"):
				meta[flatKeyOnly] = true
			case !s.lit("false") && !s.lit("null"):
				return false
			}
		case "ts_ms", "transaction":
			if !s.scalar() {
				return false
			}
		default:
			return false
		}
	}
	if !ok || s.i != len(v) || seen&(seenOp|seenSeq|seenOrd|seenCommit) != seenOp|seenSeq|seenOrd|seenCommit {
		return false
	}
	if (change.Position{Seq: change.LSN(meta[flatSeq].(uint64)), Ord: meta[flatOrd].(uint32)}).Less(d.since) {
		return false
	}
	// parseSQL's dlq_reason, but for the unfit values read refused.
	switch row[0].(byte) {
	case 'c', 'u', 'r':
		if row[2] == false {
			return false
		}
	case 'd':
		if row[1] == false {
			return false
		}
	case 't', 'm':
		return true
	}
	img := 3 + n
	if row[2] == false {
		img = 3
	}
	for _, k := range d.key {
		if row[img+k] == nil {
			return false
		}
	}
	return true
}

// image reads a before or after image, null or every column in order,
// into row[first:] and sets row[has].
func (d *flatDecoder) image(s *envScan, row []driver.Value, has, first int) bool {
	if s.lit("null") {
		for i := range d.cols {
			row[first+i] = nil
		}
		row[has] = false
		return true
	}
	if !s.next('{') {
		return false
	}
	for i, c := range d.cols {
		if (i > 0 && !s.next(',')) || !s.lit(d.keys[i]) {
			return false
		}
		if s.lit("null") {
			row[first+i] = nil
			continue
		}
		v, ok := c.read(s)
		if !ok {
			return false
		}
		row[first+i] = v
	}
	row[has] = true
	return s.next('}')
}

// source reads the source block: its lsn and txId, null or integers.
func (d *flatDecoder) source(s *envScan, meta []driver.Value, seen *int) bool {
	name, more, ok := s.member(true)
	for ; ok && more; name, more, ok = s.member(false) {
		switch string(name) {
		case "txId", "lsn":
			f, at := seenTx, flatTx
			if string(name) == "lsn" {
				f, at = seenLSN, flatLSN
			}
			if *seen&f != 0 {
				return false
			}
			*seen |= f
			if s.lit("null") {
				continue
			}
			u, ok := s.uinteger(1<<64 - 1)
			if !ok {
				return false
			}
			meta[at] = u
		case "version", "connector", "name", "ts_ms", "snapshot", "db", "schema", "table", "xmin":
			if !s.scalar() {
				return false
			}
		default:
			return false
		}
	}
	return ok
}
