package change

import (
	"bytes"
	"errors"
)

var errArray = errors.New("malformed array literal")

// appendArray converts a PostgreSQL array literal ({1,2,NULL},
// {{"a b","c"},{d,NULL}}, [0:1]={x,y}) into a JSON array whose elements
// use the element kind's encoding. Nested dimensions stay nested; explicit
// lower bounds are dropped, as Debezium does.
func appendArray(dst []byte, k Kind, s []byte) ([]byte, error) {
	if len(s) > 0 && s[0] == '[' {
		eq := -1
		for i, c := range s {
			if c == '=' {
				eq = i
				break
			}
		}
		if eq < 0 {
			return nil, errArray
		}
		s = s[eq+1:]
	}
	p := arrayParser{s: s, kind: k}
	dst, err := p.appendLevel(dst)
	if err != nil {
		return nil, err
	}
	if p.i != len(p.s) {
		return nil, errArray
	}
	return dst, nil
}

type arrayParser struct {
	s    []byte
	i    int
	kind Kind
	elem []byte // scratch for unescaped elements
}

func (p *arrayParser) appendLevel(dst []byte) ([]byte, error) {
	if p.i >= len(p.s) || p.s[p.i] != '{' {
		return nil, errArray
	}
	p.i++
	dst = append(dst, '[')
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return append(dst, ']'), nil
	}
	for n := 0; ; n++ {
		if n > 0 {
			dst = append(dst, ',')
		}
		var err error
		if p.i < len(p.s) && p.s[p.i] == '{' {
			dst, err = p.appendLevel(dst)
		} else {
			dst, err = p.appendElement(dst)
		}
		if err != nil {
			return nil, err
		}
		if p.i >= len(p.s) {
			return nil, errArray
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return append(dst, ']'), nil
		default:
			return nil, errArray
		}
	}
}

func (p *arrayParser) appendElement(dst []byte) ([]byte, error) {
	p.elem = p.elem[:0]
	if p.i >= len(p.s) {
		return nil, errArray
	}
	if p.s[p.i] == '"' {
		p.i++
		for {
			if p.i >= len(p.s) {
				return nil, errArray
			}
			c := p.s[p.i]
			p.i++
			if c == '"' {
				break
			}
			if c == '\\' {
				if p.i >= len(p.s) {
					return nil, errArray
				}
				c = p.s[p.i]
				p.i++
			}
			p.elem = append(p.elem, c)
		}
		return appendScalar(dst, p.kind, p.elem)
	}
	start := p.i
	for p.i < len(p.s) && p.s[p.i] != ',' && p.s[p.i] != '}' {
		if p.s[p.i] == '\\' {
			p.i++
		}
		p.i++
	}
	raw := p.s[start:p.i]
	if bytes.EqualFold(raw, []byte("NULL")) {
		return append(dst, "null"...), nil
	}
	for j := 0; j < len(raw); j++ {
		if raw[j] == '\\' && j+1 < len(raw) {
			j++
		}
		p.elem = append(p.elem, raw[j])
	}
	return appendScalar(dst, p.kind, p.elem)
}
