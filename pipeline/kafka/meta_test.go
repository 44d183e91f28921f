package kafka

import (
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/change"
)

// FuzzMetaRecords: a record of a meta topic, whatever it holds, is taken
// or set aside as a stray, never a panic; one lakeflow did not sign is
// always a stray; one it signed is taken when it parses, and a signature
// of other bytes does not pass for it.
func FuzzMetaRecords(f *testing.F) {
	state, _ := json.Marshal(change.SourceState{Slot: "lakeflow", Tables: []string{"public.a"}, Key: "00ff"})
	schema, _ := json.Marshal(SchemaRecord{Topic: "lf.public.a", Table: &change.Table{Schema: "public", Name: "a",
		Columns: []change.Column{{Name: "id", Type: change.Type{Kind: change.KindInt8, Name: "bigint"}, Key: true}}}})
	mark, _ := json.Marshal(change.Watermark{Seq: 200, End: 201, Commit: 1, Offsets: map[string]map[int32]int64{"lf.public.a": {0: 3}}, Split: true})
	for _, s := range []struct {
		kind       uint8
		key, value string
	}{
		{0, "", string(mark)}, {0, "", "hello"}, {0, "", `{"seq":18446744073709551615,"end":1}`},
		{1, "public.a", string(schema)}, {1, "public.b", string(schema)}, {1, "public.a", `{"topic":"t","schema":{"columns":[]}}`},
		{2, "source", string(state)}, {2, "source", `{"slot":""}`}, {2, "source", `{"slot":"s","key":"zz"}`},
	} {
		f.Add(s.kind, []byte(s.key), []byte(s.value), true)
		f.Add(s.kind, []byte(s.key), []byte(s.value), false)
	}
	g := &Signer{key: []byte("a pipeline's key"), from: map[string]int64{}}
	f.Fuzz(func(t *testing.T, kind uint8, key, value []byte, sign bool) {
		topics := []string{WatermarkTopic("lf"), SchemaTopic("lf"), StateTopic("lf")}
		topic := topics[int(kind)%len(topics)]
		read := func(mac []byte) (taken bool) {
			var headers []kgo.RecordHeader
			if mac != nil {
				headers = []kgo.RecordHeader{{Key: macHeader, Value: []byte(hex.EncodeToString(mac))}}
			}
			r := metaRecord{offset: 7, key: key, value: value, headers: headers}
			var stray *Stray
			switch topic {
			case WatermarkTopic("lf"):
				_, stray = watermark(g, &kgo.Record{Topic: topic, Offset: 7, Key: key, Value: value, Headers: headers})
			case SchemaTopic("lf"):
				_, stray = schemaRecord(g, topic, r)
			default:
				var s *change.SourceState
				var next *Signer
				s, next, stray = stateRecord(g, topic, r)
				if stray == nil && (s == nil || next != g) {
					t.Fatalf("a state record taken as %+v, signer %p (want %p)", s, next, g)
				}
			}
			if stray != nil && (stray.Reason == "" || stray.Topic != topic || stray.Offset != 7) {
				t.Fatalf("stray %+v does not say what and where", stray)
			}
			return stray == nil
		}
		if !sign {
			if read(nil) {
				t.Fatalf("an unsigned record of %s was taken: %q", topic, value)
			}
			return
		}
		mac := g.mac(topic, key, value)
		taken := read(mac)
		forged := append([]byte(nil), mac...)
		forged[0] ^= 1
		if read(forged) {
			t.Fatalf("a record of %s with a forged signature was taken: %q", topic, value)
		}
		if other := g.mac(topic, append(append([]byte(nil), key...), 'x'), value); taken && read(other) {
			t.Fatalf("a record of %s was taken under another record's signature: %q", topic, value)
		}
	})
}
