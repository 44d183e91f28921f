package kafka

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lakeflow/lakeflow/internal/change"
)

// macHeader carries, on every record lakeflow writes to its meta topics
// (_schemas, _state, _watermarks), an HMAC of the record's topic, key and
// value under the pipeline's key.
const macHeader = "lakeflow-mac"

// Signer tells the records lakeflow wrote to its meta topics from those
// another client wrote there (a stray "hello", a hand-made watermark):
// lakeflow signs what it writes, and sets aside as dead letters what it
// reads unsigned, so that no such record can stop it or move its
// positions. The key lives in the source state (Kafka's _state and the
// warehouse's copy): it guards against mistakes, not against someone who
// reads lakeflow's own state.
type Signer struct {
	key []byte
	// from is, per meta topic, the offset from which records are signed:
	// those before were written by a lakeflow that did not sign them.
	from map[string]int64
}

// NewKey returns a new pipeline key (hex).
func NewKey() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewSigner returns the signer of the pipeline whose state s is.
func NewSigner(s *change.SourceState) (*Signer, error) {
	key, err := hex.DecodeString(s.Key)
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("the source state's key %q is not a key", s.Key)
	}
	return &Signer{key: key, from: s.SignedFrom}, nil
}

// mac is the HMAC of a record of topic.
func (g *Signer) mac(topic string, key, value []byte) []byte {
	h := hmac.New(sha256.New, g.key)
	for _, part := range [][]byte{[]byte(topic), key, value} {
		var n [8]byte
		for i, l := 0, len(part); i < 8; i, l = i+1, l>>8 {
			n[i] = byte(l)
		}
		h.Write(n[:])
		h.Write(part)
	}
	return h.Sum(nil)[:16]
}

// sign adds the MAC header to r (a nil signer signs nothing).
func (g *Signer) sign(r *kgo.Record) {
	if g == nil {
		return
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: macHeader, Value: []byte(hex.EncodeToString(g.mac(r.Topic, r.Key, r.Value)))})
}

// signed says whether lakeflow wrote the record at offset of topic (a nil
// signer trusts every record).
func (g *Signer) signed(topic string, offset int64, key, value []byte, headers []kgo.RecordHeader) bool {
	if g == nil || offset < g.from[topic] {
		return true
	}
	for _, h := range headers {
		if h.Key != macHeader {
			continue
		}
		got, err := hex.DecodeString(string(h.Value))
		return err == nil && hmac.Equal(got, g.mac(topic, key, value))
	}
	return false
}

// Signed says whether lakeflow wrote the consumed record r.
func (g *Signer) Signed(r *kgo.Record) bool {
	return g.signed(r.Topic, r.Offset, r.Key, r.Value, r.Headers)
}

// Stray is a record of a meta topic lakeflow did not write, or cannot
// read: it is set aside as a dead letter.
type Stray struct {
	Topic     string
	Partition int32
	Offset    int64
	Value     []byte
	Reason    string
}
