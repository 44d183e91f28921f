package postgres

import (
	"bytes"
	"fmt"

	"github.com/lakeflow/lakeflow/internal/change"
)

// copyReader is the io.Writer that COPY … TO STDOUT (text format) streams
// into. It splits rows, undoes COPY's backslash escaping so every value is
// the type's plain text output (the same text pgoutput sends), and hands
// each row to emit. The row and its datums are valid only during emit.
type copyReader struct {
	columns int
	emit    func(row []change.Datum) error
	partial []byte
	row     []change.Datum
	values  []byte
	spans   []span
}

type span struct {
	start, end int
	null       bool
}

func newCopyReader(columns int, emit func([]change.Datum) error) *copyReader {
	return &copyReader{columns: columns, emit: emit, row: make([]change.Datum, columns), values: make([]byte, 0, 4096)}
}

func (r *copyReader) Write(p []byte) (int, error) {
	n := len(p)
	if len(r.partial) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.partial = append(r.partial, p...)
			return n, nil
		}
		r.partial = append(r.partial, p[:i]...)
		if err := r.line(r.partial); err != nil {
			return 0, err
		}
		r.partial = r.partial[:0]
		p = p[i+1:]
	}
	for {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.partial = append(r.partial, p...)
			return n, nil
		}
		if err := r.line(p[:i]); err != nil {
			return 0, err
		}
		p = p[i+1:]
	}
}

// finish reports a row left without its newline.
func (r *copyReader) finish() error {
	if len(r.partial) > 0 {
		return fmt.Errorf("COPY output ended inside a row")
	}
	return nil
}

func (r *copyReader) line(line []byte) error {
	r.values = r.values[:0]
	r.spans = r.spans[:0]
	start := 0
	for i := 0; i <= len(line); i++ {
		if i < len(line) && line[i] != '\t' {
			continue
		}
		field := line[start:i]
		start = i + 1
		if len(field) == 2 && field[0] == '\\' && field[1] == 'N' {
			r.spans = append(r.spans, span{null: true})
			continue
		}
		s := len(r.values)
		r.values = unescapeCopy(r.values, field)
		r.spans = append(r.spans, span{start: s, end: len(r.values)})
	}
	if len(r.spans) != r.columns {
		return fmt.Errorf("COPY row has %d columns, want %d", len(r.spans), r.columns)
	}
	// values may have moved while growing: slice it only now.
	for i, sp := range r.spans {
		if sp.null {
			r.row[i] = change.Datum{Null: true}
		} else {
			r.row[i] = change.Datum{Text: r.values[sp.start:sp.end:sp.end]}
		}
	}
	return r.emit(r.row)
}

// unescapeCopy appends field with COPY text-format escapes resolved.
func unescapeCopy(dst, field []byte) []byte {
	for i := 0; i < len(field); i++ {
		c := field[i]
		if c != '\\' || i+1 == len(field) {
			dst = append(dst, c)
			continue
		}
		i++
		switch e := field[i]; e {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'v':
			dst = append(dst, '\v')
		case 'x':
			v, n := 0, 0
			for n < 2 && i+1 < len(field) && isHex(field[i+1]) {
				i++
				v = v*16 + hexVal(field[i])
				n++
			}
			if n == 0 {
				dst = append(dst, 'x')
			} else {
				dst = append(dst, byte(v))
			}
		default:
			if e >= '0' && e <= '7' {
				v := int(e - '0')
				for n := 1; n < 3 && i+1 < len(field) && field[i+1] >= '0' && field[i+1] <= '7'; n++ {
					i++
					v = v*8 + int(field[i]-'0')
				}
				dst = append(dst, byte(v))
			} else {
				dst = append(dst, e)
			}
		}
	}
	return dst
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return int(c-'A') + 10
}
