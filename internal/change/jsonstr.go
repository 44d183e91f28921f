package change

import "unicode/utf8"

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string, escaped as every string of an
// envelope is.
func AppendString(dst []byte, s string) []byte { return appendJSONString(dst, s) }

// appendBytesString appends b as a JSON string. PostgreSQL text in a UTF8
// database is valid UTF-8; anything else has its bad bytes replaced rather
// than being emitted as invalid JSON.
func appendBytesString(dst []byte, b []byte) []byte {
	if !utf8.Valid(b) {
		return appendJSONString(dst, []byte(string([]rune(string(b)))))
	}
	return appendJSONString(dst, b)
}

func appendJSONString[T string | []byte](dst []byte, s T) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
