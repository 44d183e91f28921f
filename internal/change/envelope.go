package change

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strconv"
)

// Envelope writes events as Kafka records in Debezium's JSON form with
// schemas disabled (decimal.handling.mode=string, interval.handling.mode=
// string, binary.handling.mode=base64; dates as days, times and
// timestamps as microseconds whatever their declared precision), plus
// lakeflow's position fields _cdc_seq, _cdc_ord and _commit_ts, so an
// existing Debezium consumer can read the topics. A before image that holds
// only the key (a table without REPLICA IDENTITY FULL) is marked
// "_before_key_only": true. An after image's unchanged TOASTed values
// (Datum.Unchanged) are Debezium's placeholder (Unavailable), and
// "_unchanged" lists their columns.
type Envelope struct {
	Name     string // Debezium's topic.prefix / logical server name
	Database string
}

// AppendKey appends the record key: the primary key columns as a JSON
// object, e.g. {"order_id":7,"line_no":1}. Truncates and
// reconciles have no key (nil).
func (env *Envelope) AppendKey(dst []byte, ev *Event) ([]byte, error) {
	if ev.Op == OpTruncate || ev.Op == OpReconcile {
		return dst, nil
	}
	img := ev.Image()
	dst = append(dst, '{')
	for n, i := range ev.Table.KeyColumns() {
		if n > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = appendField(dst, ev.Table.Columns[i], img[i]); err != nil {
			return nil, fmt.Errorf("%s key: %w", ev.Table.ID(), err)
		}
	}
	return append(dst, '}'), nil
}

// AppendValue appends the envelope. tsMillis is Debezium's top-level ts_ms,
// the time lakeflow processed the event; nothing orders by it.
func (env *Envelope) AppendValue(dst []byte, ev *Event, tsMillis int64) ([]byte, error) {
	var err error
	dst = append(dst, `{"before":`...)
	if dst, err = appendImage(dst, ev.Table, ev.Before); err != nil {
		return nil, err
	}
	dst = append(dst, `,"after":`...)
	unchanged := false
	if dst, err = appendImage(dst, ev.Table, ev.After); err != nil {
		return nil, err
	}
	for _, d := range ev.After {
		unchanged = unchanged || d.Unchanged()
	}
	dst = append(dst, `,"source":{"version":"lakeflow","connector":"postgresql","name":`...)
	dst = AppendString(dst, env.Name)
	dst = append(dst, `,"ts_ms":`...)
	dst = strconv.AppendInt(dst, floorDiv(ev.Commit, 1000), 10)
	dst = append(dst, `,"snapshot":"`...)
	dst = append(dst, ev.Snapshot...)
	dst = append(dst, `","db":`...)
	dst = AppendString(dst, env.Database)
	dst = append(dst, `,"schema":`...)
	dst = AppendString(dst, ev.Table.Schema)
	dst = append(dst, `,"table":`...)
	dst = AppendString(dst, ev.Table.Name)
	dst = append(dst, `,"txId":`...)
	if ev.TxID == 0 {
		dst = append(dst, "null"...)
	} else {
		dst = strconv.AppendUint(dst, uint64(ev.TxID), 10)
	}
	dst = append(dst, `,"lsn":`...)
	dst = strconv.AppendUint(dst, uint64(ev.LSN), 10)
	dst = append(dst, `,"xmin":null},"op":"`...)
	dst = append(dst, byte(ev.Op))
	dst = append(dst, `","ts_ms":`...)
	dst = strconv.AppendInt(dst, tsMillis, 10)
	dst = append(dst, `,"transaction":null,"_cdc_seq":`...)
	dst = strconv.AppendUint(dst, uint64(ev.Pos.Seq), 10)
	dst = append(dst, `,"_cdc_ord":`...)
	dst = strconv.AppendUint(dst, uint64(ev.Pos.Ord), 10)
	dst = append(dst, `,"_commit_ts":"`...)
	dst = AppendMicrosISO(dst, ev.Commit)
	dst = append(dst, '"')
	if ev.KeyOnly {
		dst = append(dst, `,"_before_key_only":true`...)
	}
	if unchanged {
		dst = append(dst, `,"_unchanged":[`...)
		n := 0
		for i, d := range ev.After {
			if d.Unchanged() {
				if n > 0 {
					dst = append(dst, ',')
				}
				dst = AppendString(dst, ev.Table.Columns[i].Name)
				n++
			}
		}
		dst = append(dst, ']')
	}
	return append(dst, '}'), nil
}

// Unavailable is Debezium's placeholder for a value PostgreSQL did not
// log (unavailable.value.placeholder).
const Unavailable = "__debezium_unavailable_value"

// appendUnavailable appends the placeholder as Debezium writes it for a
// column of type t: a string, base64 for bytea, a list of one for an
// array.
func appendUnavailable(dst []byte, t Type) []byte {
	if t.IsArray() {
		t.Dims = 0
		return append(appendUnavailable(append(dst, '['), t), ']')
	}
	if t.Kind == KindBytea {
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, []byte(Unavailable))
		return append(dst, '"')
	}
	return AppendString(dst, Unavailable)
}

func appendImage(dst []byte, t *Table, img []Datum) ([]byte, error) {
	if img == nil {
		return append(dst, "null"...), nil
	}
	if len(img) != len(t.Columns) {
		return nil, fmt.Errorf("%s: row has %d values for %d columns", t.ID(), len(img), len(t.Columns))
	}
	dst = append(dst, '{')
	for i, c := range t.Columns {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = appendField(dst, c, img[i]); err != nil {
			return nil, fmt.Errorf("%s: %w", t.ID(), err)
		}
	}
	return append(dst, '}'), nil
}

func appendField(dst []byte, c Column, d Datum) ([]byte, error) {
	dst = AppendString(dst, c.Name)
	dst = append(dst, ':')
	if d.Null {
		return append(dst, "null"...), nil
	}
	if d.Unchanged() {
		return appendUnavailable(dst, c.Type), nil
	}
	out, err := AppendValue(dst, c.Type, d.Text)
	if err != nil {
		// A value the type's encoding cannot carry (a timestamp beyond
		// microsecond range): its PostgreSQL text travels instead, and the
		// warehouse sets the event aside as a dead letter, naming it.
		return appendBytesString(dst, d.Text), nil
	}
	return out, nil
}

// seqField is how the envelope names an event's position.
var seqField = []byte(`"_cdc_seq":`)

// PeekSeq reads a record's _cdc_seq without decoding the envelope: the
// last field of that name (lakeflow writes it near the end), a number or
// a string of digits. ok is false for a record that has none.
func PeekSeq(v []byte) (LSN, bool) {
	i := bytes.LastIndex(v, seqField)
	if i < 0 {
		return 0, false
	}
	rest := v[i+len(seqField):]
	for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '"') {
		rest = rest[1:]
	}
	var n uint64
	digits := 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			break
		}
		if n > (1<<64-1-uint64(c-'0'))/10 {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		digits++
	}
	return LSN(n), digits > 0
}
