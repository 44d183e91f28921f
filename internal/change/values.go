package change

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"math"
	"strconv"
)

// Debezium's encodings of PostgreSQL's infinities (from its source: the
// date values are as Debezium writes them, +infinity being the smaller).
const (
	DateInfinity         = -2147472692
	DateNegInfinity      = -2147472691
	TimestampInfinity    = 9223372036825200000
	TimestampNegInfinity = -9223372036832400000
	// MicrosPerDay is a day in microseconds, the unit of times and
	// timestamps in envelopes.
	MicrosPerDay = 86400 * 1000000
)

var errSyntax = errors.New("unexpected text for this type")

// AppendValue appends the envelope encoding of one non-NULL value given in
// PostgreSQL's text output format (sessions use DateStyle ISO, TimeZone
// UTC, IntervalStyle iso_8601, bytea_output hex, lc_monetary C).
func AppendValue(dst []byte, t Type, text []byte) ([]byte, error) {
	if t.IsArray() {
		return appendArray(dst, t.Kind, text)
	}
	return appendScalar(dst, t.Kind, text)
}

func appendScalar(dst []byte, k Kind, s []byte) ([]byte, error) {
	switch k {
	case KindInt2, KindInt4, KindInt8:
		if !isInteger(s) {
			return nil, errSyntax
		}
		return append(dst, s...), nil
	case KindFloat4, KindFloat8:
		switch string(s) {
		case "NaN", "Infinity", "-Infinity":
			return appendBytesString(dst, s), nil
		}
		if !isNumber(s) {
			return nil, errSyntax
		}
		return append(dst, s...), nil
	case KindMoney:
		// lc_monetary=C prints -$1,234.56; Debezium strips symbol and commas.
		dst = append(dst, '"')
		for _, c := range s {
			switch {
			case c == '$' || c == ',':
			case c == '-' || c == '.' || (c >= '0' && c <= '9'):
				dst = append(dst, c)
			default:
				return nil, errSyntax
			}
		}
		return append(dst, '"'), nil
	case KindBool:
		switch string(s) {
		case "t":
			return append(dst, "true"...), nil
		case "f":
			return append(dst, "false"...), nil
		}
		return nil, errSyntax
	case KindBytea:
		if len(s) < 2 || s[0] != '\\' || s[1] != 'x' {
			return nil, errSyntax
		}
		raw := make([]byte, hex.DecodedLen(len(s)-2))
		if _, err := hex.Decode(raw, s[2:]); err != nil {
			return nil, errSyntax
		}
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		return append(dst, '"'), nil
	case KindDate:
		switch string(s) {
		case "infinity":
			return strconv.AppendInt(dst, DateInfinity, 10), nil
		case "-infinity":
			return strconv.AppendInt(dst, DateNegInfinity, 10), nil
		}
		days, rest, ok := parseDate(s)
		if !ok || len(rest) != 0 {
			return nil, errSyntax
		}
		return strconv.AppendInt(dst, days, 10), nil
	case KindTime:
		us, ok := parseClock(s)
		if !ok {
			return nil, errSyntax
		}
		return strconv.AppendInt(dst, us, 10), nil
	case KindTimestamp:
		switch string(s) {
		case "infinity":
			return strconv.AppendInt(dst, TimestampInfinity, 10), nil
		case "-infinity":
			return strconv.AppendInt(dst, TimestampNegInfinity, 10), nil
		}
		us, err := parseTimestamp(s, false)
		if err != nil {
			return nil, err
		}
		return strconv.AppendInt(dst, us, 10), nil
	case KindTimestampTZ:
		switch string(s) {
		case "infinity", "-infinity":
			return appendBytesString(dst, s), nil
		}
		us, err := parseTimestamp(s, true)
		if err != nil {
			return nil, err
		}
		dst = append(dst, '"')
		dst = AppendMicrosISO(dst, us)
		return append(dst, '"'), nil
	default:
		// numeric (exact, as Debezium's decimal.handling.mode=string), text,
		// uuid, json(b) documents, iso_8601 intervals, timetz, enums, inet…
		return appendBytesString(dst, s), nil
	}
}

// isInteger and isNumber accept exactly JSON's number grammar (PostgreSQL
// prints 1.5, -0, 1e+20), integers without fraction or exponent.
func isInteger(s []byte) bool {
	n, ok := JSONNumber(s)
	return ok && n == len(s) && !containsAny(s, ".eE")
}

func isNumber(s []byte) bool {
	n, ok := JSONNumber(s)
	return ok && n == len(s)
}

func containsAny(s []byte, chars string) bool {
	for _, c := range s {
		for i := 0; i < len(chars); i++ {
			if c == chars[i] {
				return true
			}
		}
	}
	return false
}

// JSONNumber scans -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? and
// returns how many bytes it covers.
func JSONNumber(s []byte) (int, bool) {
	i := 0
	digits := func() int {
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i - start
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if digits() == 0 {
		return i, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return i, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return i, false
		}
	}
	return i, true
}

// parseDate reads YYYY-MM-DD (years may have more digits) with an optional
// " BC" suffix and returns days since 1970-01-01 plus the unread rest.
func parseDate(s []byte) (days int64, rest []byte, ok bool) {
	i := 0
	var y int64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		y = y*10 + int64(s[i]-'0')
		i++
	}
	if i < 4 || i+6 > len(s) || s[i] != '-' || s[i+3] != '-' {
		return 0, nil, false
	}
	m, ok1 := two(s[i+1:])
	d, ok2 := two(s[i+4:])
	if !ok1 || !ok2 || m < 1 || m > 12 || d < 1 || d > 31 {
		return 0, nil, false
	}
	rest = s[i+6:]
	if n := len(rest); n >= 3 && string(rest[n-3:]) == " BC" {
		y = 1 - y // astronomical year numbering: 1 BC is year 0
		rest = rest[:n-3]
	}
	return daysFromCivil(y, m, d), rest, true
}

// parseClock reads HH:MM:SS[.ffffff] as microseconds since midnight.
func parseClock(s []byte) (int64, bool) {
	if len(s) < 8 || s[2] != ':' || s[5] != ':' {
		return 0, false
	}
	h, ok1 := two(s)
	m, ok2 := two(s[3:])
	sec, ok3 := two(s[6:])
	if !ok1 || !ok2 || !ok3 {
		return 0, false
	}
	us := ((h*60+m)*60 + sec) * 1000000
	frac := s[8:]
	if len(frac) > 0 {
		if frac[0] != '.' || len(frac) > 7 || len(frac) < 2 {
			return 0, false
		}
		scale := int64(100000)
		for _, c := range frac[1:] {
			if c < '0' || c > '9' {
				return 0, false
			}
			us += int64(c-'0') * scale
			scale /= 10
		}
	}
	return us, true
}

// parseTimestamp reads "YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]"
// as microseconds since the Unix epoch (UTC when withZone).
func parseTimestamp(s []byte, withZone bool) (int64, error) {
	bc := false
	if n := len(s); n > 3 && string(s[n-3:]) == " BC" {
		bc, s = true, s[:n-3]
	}
	sp := -1
	for i, c := range s {
		if c == ' ' {
			sp = i
			break
		}
	}
	if sp < 0 {
		return 0, errSyntax
	}
	datePart, clock := s[:sp], s[sp+1:]
	if bc {
		datePart = append(append(make([]byte, 0, len(datePart)+3), datePart...), " BC"...)
	}
	days, rest, ok := parseDate(datePart)
	if !ok || len(rest) != 0 {
		return 0, errSyntax
	}
	var offset int64
	if withZone {
		z := len(clock) - 1
		for z >= 0 && clock[z] != '+' && clock[z] != '-' {
			z--
		}
		if z < 8 {
			return 0, errSyntax
		}
		off, ok := parseOffset(clock[z:])
		if !ok {
			return 0, errSyntax
		}
		offset, clock = off, clock[:z]
	}
	us, ok := parseClock(clock)
	if !ok {
		return 0, errSyntax
	}
	// Two days inside int64 microseconds (DuckDB's range too, ±294247
	// years), so the sum below cannot overflow.
	if days > math.MaxInt64/MicrosPerDay-2 || days < math.MinInt64/MicrosPerDay+2 {
		return 0, errors.New("outside the range of microsecond timestamps (about 294247 years from 1970)")
	}
	return days*MicrosPerDay + us - offset, nil
}

// parseOffset reads +HH, +HH:MM or +HH:MM:SS as microseconds.
func parseOffset(s []byte) (int64, bool) {
	sign := int64(1)
	if s[0] == '-' {
		sign = -1
	}
	s = s[1:]
	var secs int64
	for unit := int64(3600); unit >= 1; unit /= 60 {
		v, ok := two(s)
		if !ok {
			return 0, false
		}
		secs += v * unit
		s = s[2:]
		if len(s) == 0 {
			return sign * secs * 1000000, true
		}
		if s[0] != ':' {
			return 0, false
		}
		s = s[1:]
	}
	return 0, false
}

func two(s []byte) (int64, bool) {
	if len(s) < 2 || s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9' {
		return 0, false
	}
	return int64(s[0]-'0')*10 + int64(s[1]-'0'), true
}

// daysFromCivil and civilFromDays are Howard Hinnant's proleptic Gregorian
// conversions; they hold for any year, BC included.
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(y, 400)
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

func civilFromDays(z int64) (y, m, d int64) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	y = yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = doy - (153*mp+2)/5 + 1
	m = mp + 3
	if m > 12 {
		m -= 12
	}
	if m <= 2 {
		y++
	}
	return y, m, d
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// AppendMicrosISO appends microseconds since the Unix epoch as an ISO 8601
// UTC timestamp, 2024-01-31T10:00:00.123456Z, with BC years as negative
// astronomical years (-0043 is 44 BC) and no fraction when it is zero.
func AppendMicrosISO(dst []byte, us int64) []byte {
	days := floorDiv(us, MicrosPerDay)
	rem := us - days*MicrosPerDay
	y, m, d := civilFromDays(days)
	if y < 0 {
		dst = append(dst, '-')
		y = -y
	}
	dst = appendPadded(dst, y, 4)
	dst = append(dst, '-')
	dst = appendPadded(dst, m, 2)
	dst = append(dst, '-')
	dst = appendPadded(dst, d, 2)
	dst = append(dst, 'T')
	secs := rem / 1000000
	dst = appendPadded(dst, secs/3600, 2)
	dst = append(dst, ':')
	dst = appendPadded(dst, secs/60%60, 2)
	dst = append(dst, ':')
	dst = appendPadded(dst, secs%60, 2)
	if frac := rem % 1000000; frac != 0 {
		dst = append(dst, '.')
		digits := 6
		for frac%10 == 0 {
			frac /= 10
			digits--
		}
		dst = appendPadded(dst, frac, digits)
	}
	return append(dst, 'Z')
}

// ParseMicrosISO reads what AppendMicrosISO writes for years 1 to 9999
// (every timestamp DuckDB and PostgreSQL agree on), a fraction of one to
// six digits, back into microseconds; it reports false for anything else.
func ParseMicrosISO(s []byte) (int64, bool) {
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[len(s)-1] != 'Z' {
		return 0, false
	}
	c, ok1 := two(s)
	y, ok2 := two(s[2:])
	m, ok3 := two(s[5:])
	d, ok4 := two(s[8:])
	y += c * 100
	if !ok1 || !ok2 || !ok3 || !ok4 || y < 1 || m < 1 || m > 12 || d < 1 || d > 31 {
		return 0, false
	}
	days := daysFromCivil(y, m, d)
	if _, _, dd := civilFromDays(days); dd != d { // 31 April, 29 February 2023
		return 0, false
	}
	h, _ := two(s[11:])
	mi, _ := two(s[14:])
	sec, _ := two(s[17:])
	us, ok := parseClock(s[11 : len(s)-1])
	if !ok || h > 23 || mi > 59 || sec > 59 {
		return 0, false
	}
	return days*MicrosPerDay + us, true
}

func appendPadded(dst []byte, v int64, width int) []byte {
	var buf [20]byte
	b := strconv.AppendInt(buf[:0], v, 10)
	for i := len(b); i < width; i++ {
		dst = append(dst, '0')
	}
	return append(dst, b...)
}
