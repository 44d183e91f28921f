package warehouse

import (
	"bytes"
	"math"
	"strconv"

	"github.com/lakeflow/lakeflow/internal/change"
)

// envScan reads one envelope the way change.Envelope writes it: no
// whitespace, strings escaped only as it escapes them. It is strict on
// purpose: whatever it refuses is decoded by parseSQL instead, so the
// only JSON it must get right is the JSON lakeflow writes.
type envScan struct {
	b []byte
	i int
}

// next reports whether the next byte is c, and consumes it if so.
func (s *envScan) next(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// lit consumes lit if the input goes on with it.
func (s *envScan) lit(lit string) bool {
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

func (s *envScan) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// member reads an object's next member up to its value: the opening
// brace first (first), then a comma unless the object ends there (more
// false). Keys with escapes are refused.
func (s *envScan) member(first bool) (name []byte, more, ok bool) {
	if first && !s.next('{') {
		return nil, false, false
	}
	if s.next('}') {
		return nil, false, true
	}
	if !first && !s.next(',') {
		return nil, false, false
	}
	name, esc, ok := s.str()
	return name, true, ok && !esc && s.next(':')
}

// str reads a string and returns its text between the quotes, still
// escaped (esc) if it holds an escape. It accepts only the escapes
// change.Envelope writes: \" \\ \n \r \t and \u00XX for the other
// control characters but NUL.
func (s *envScan) str() (text []byte, esc, ok bool) {
	if !s.next('"') {
		return nil, false, false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], esc, true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			esc = true
			if s.i+1 >= len(s.b) {
				return nil, false, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if _, ok := controlEscape(s.b[s.i:]); !ok {
					return nil, false, false
				}
				s.i += 6
			default:
				return nil, false, false
			}
		default:
			s.i++
		}
	}
	return nil, false, false
}

// plain reads a string that holds no escape.
func (s *envScan) plain() ([]byte, bool) {
	text, esc, ok := s.str()
	return text, ok && !esc
}

// controlEscape reads \u00XX for a control character other than NUL.
func controlEscape(b []byte) (byte, bool) {
	if len(b) < 6 || string(b[:4]) != `\u00` || (b[4] != '0' && b[4] != '1') {
		return 0, false
	}
	lo := b[5]
	switch {
	case lo >= '0' && lo <= '9':
		lo -= '0'
	case lo >= 'a' && lo <= 'f':
		lo -= 'a' - 10
	default:
		return 0, false
	}
	c := (b[4]-'0')<<4 | lo
	return c, c != 0
}

// unescape resolves the escapes str accepted.
func unescape(text []byte) []byte {
	out := make([]byte, 0, len(text))
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		switch text[i] {
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			c, _ := controlEscape(text[i-1:])
			out = append(out, c)
			i += 4
		default:
			out = append(out, text[i])
		}
	}
	return out
}

// integer reads a JSON integer as strconv would print it (no fraction,
// exponent, plus sign or leading zero) that fits in [lo, hi]; hi may be
// at most 1<<63-1 unless neg is refused by lo >= 0, see uinteger.
func (s *envScan) integer(lo, hi int64) (int64, bool) {
	neg := s.next('-')
	u, ok := s.digits()
	if !ok {
		return 0, false
	}
	if neg {
		if u > 1<<63 || -int64(u) < lo { // -int64(1<<63) is MinInt64
			return 0, false
		}
		return -int64(u), true
	}
	if u > uint64(hi) {
		return 0, false
	}
	return int64(u), true
}

// uinteger reads a JSON integer in [0, hi], as integer does.
func (s *envScan) uinteger(hi uint64) (uint64, bool) {
	u, ok := s.digits()
	return u, ok && u <= hi
}

// digits reads 0 or [1-9][0-9]* that fits in a uint64 and is not followed
// by a fraction or exponent.
func (s *envScan) digits() (uint64, bool) {
	start := s.i
	var u uint64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		d := uint64(s.b[s.i] - '0')
		if u > (1<<64-1-d)/10 {
			return 0, false
		}
		u = u*10 + d
		s.i++
	}
	n := s.i - start
	if n == 0 || (n > 1 && s.b[start] == '0') {
		return 0, false
	}
	switch s.peek() {
	case ',', '}':
		return u, true
	}
	return 0, false
}

// float reads a JSON number of at most 17 significant digits (what
// PostgreSQL prints for a float) as a float64 (bits 64) or the float32
// DuckDB makes of it (bits 32), refusing one whose value is zero but
// spelled negative or out of the type's normal range: JSON -0 and
// DuckDB's casts of subnormals and of what overflows are not worth
// matching.
func (s *envScan) float(bits int) (float64, bool) {
	n, ok := change.JSONNumber(s.b[s.i:])
	tok := s.b[s.i : s.i+n]
	s.i += n
	if !ok || significant(tok) > 17 {
		return 0, false
	}
	switch s.peek() {
	case ',', '}':
	default:
		return 0, false
	}
	f, err := strconv.ParseFloat(string(tok), 64)
	if err == nil && bits == 32 {
		// from_json gives DuckDB an integer's own digits, and of any
		// other number the double's shortest text, which the cast to
		// FLOAT rounds again.
		text := string(tok)
		if bytes.ContainsAny(tok, ".eE") {
			text = strconv.FormatFloat(f, 'g', -1, 64)
		}
		f, err = strconv.ParseFloat(text, 32)
	}
	smallest := 0x1p-1022 // the smallest normal number
	if bits == 32 {
		smallest = 0x1p-126
	}
	if err != nil || (f == 0 && tok[0] == '-') || (f != 0 && math.Abs(f) < smallest) {
		return 0, false
	}
	return f, true
}

// significant counts the digits of a JSON number's mantissa from its
// first non-zero one.
func significant(tok []byte) int {
	n, leading := 0, true
	for _, c := range tok {
		switch {
		case c == 'e' || c == 'E':
			return n
		case c == '0' && leading:
		case c >= '0' && c <= '9':
			leading = false
			n++
		}
	}
	return n
}

// scalar skips a value that is null, a boolean, an integer or a string.
func (s *envScan) scalar() bool {
	switch s.peek() {
	case 'n':
		return s.lit("null")
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case '"':
		_, _, ok := s.str()
		return ok
	case '-':
		s.i++
	}
	_, ok := s.digits()
	return ok
}
