package change

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"
)

func TestAppendValue(t *testing.T) {
	num := func(p, s int) Type { return Type{Kind: KindNumeric, Precision: p, Scale: s} }
	for _, tc := range []struct {
		typ  Type
		text string
		want string
	}{
		{Type{Kind: KindInt4}, "-2147483648", `-2147483648`},
		{Type{Kind: KindInt8}, "9223372036854775807", `9223372036854775807`},
		{Type{Kind: KindFloat8}, "1e+300", `1e+300`},
		{Type{Kind: KindFloat8}, "-0", `-0`},
		{Type{Kind: KindFloat4}, "NaN", `"NaN"`},
		{Type{Kind: KindFloat8}, "-Infinity", `"-Infinity"`},
		{num(12, 3), "-0.001", `"-0.001"`},
		{Type{Kind: KindNumeric}, "123456789012345678901234567890.000000000000001", `"123456789012345678901234567890.000000000000001"`},
		{Type{Kind: KindNumeric}, "NaN", `"NaN"`},
		{Type{Kind: KindMoney}, "-$92,233,720,368,547,758.08", `"-92233720368547758.08"`},
		{Type{Kind: KindBool}, "t", `true`},
		{Type{Kind: KindBool}, "f", `false`},
		{Type{Kind: KindText}, "tab\there \"q\" \\ \n\x01 ü 🚀", `"tab\there \"q\" \\ \n\u0001 ü 🚀"`},
		{Type{Kind: KindBytea}, `\x00ff10`, `"AP8Q"`},
		{Type{Kind: KindBytea}, `\x`, `""`},
		{Type{Kind: KindDate}, "1970-01-01", `0`},
		{Type{Kind: KindDate}, "2024-02-29", `19782`},
		{Type{Kind: KindDate}, "1969-12-31", `-1`},
		{Type{Kind: KindDate}, "0044-03-15 BC", `-735160`},
		{Type{Kind: KindDate}, "infinity", `-2147472692`},
		{Type{Kind: KindTime}, "13:45:01.5", `49501500000`},
		{Type{Kind: KindTime}, "24:00:00", `86400000000`},
		{Type{Kind: KindTimeTZ}, "10:00:00+05:30", `"10:00:00+05:30"`},
		{Type{Kind: KindTimestamp}, "2024-02-29 23:59:59.999999", `1709251199999999`},
		{Type{Kind: KindTimestamp}, "1969-12-31 23:59:59.999999", `-1`},
		{Type{Kind: KindTimestamp}, "-infinity", `-9223372036832400000`},
		{Type{Kind: KindTimestampTZ}, "2024-02-29 23:59:59.12+00", `"2024-02-29T23:59:59.12Z"`},
		{Type{Kind: KindTimestampTZ}, "2024-03-01 05:29:59+05:30", `"2024-02-29T23:59:59Z"`},
		{Type{Kind: KindTimestampTZ}, "1900-01-01 00:00:00+00:19:32", `"1899-12-31T23:40:28Z"`},
		{Type{Kind: KindTimestampTZ}, "0044-03-15 12:00:00+00 BC", `"-0043-03-15T12:00:00Z"`},
		{Type{Kind: KindTimestampTZ}, "infinity", `"infinity"`},
		{Type{Kind: KindInterval}, "P-1Y-2M3DT-4H-5M-6S", `"P-1Y-2M3DT-4H-5M-6S"`},
		{Type{Kind: KindJSONB}, `{"a": [1, "x"]}`, `"{\"a\": [1, \"x\"]}"`},
		{Type{Kind: KindInt4, Dims: 1}, "{1,2,NULL}", `[1,2,null]`},
		{Type{Kind: KindInt4, Dims: 1}, "{{1,2},{3,NULL}}", `[[1,2],[3,null]]`},
		{Type{Kind: KindInt4, Dims: 1}, "[0:1]={7,8}", `[7,8]`},
		{Type{Kind: KindText, Dims: 1}, `{"a b","c\"d",NULL,"NULL",",",x\\y}`, `["a b","c\"d",null,"NULL",",","x\\y"]`},
		{Type{Kind: KindText, Dims: 1}, `{}`, `[]`},
		{Type{Kind: KindDate, Dims: 1}, `{1970-01-02,NULL}`, `[1,null]`},
		{Type{Kind: KindBytea, Dims: 1}, `{"\\x01",NULL}`, `["AQ==",null]`},
	} {
		got, err := AppendValue(nil, tc.typ, []byte(tc.text))
		if err != nil {
			t.Errorf("%s %q: %v", tc.typ.Kind, tc.text, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("%s %q: got %s, want %s", tc.typ.Kind, tc.text, got, tc.want)
		}
		if !json.Valid(got) {
			t.Errorf("%s %q: %s is not JSON", tc.typ.Kind, tc.text, got)
		}
	}
}

func TestAppendValueRejectsGarbage(t *testing.T) {
	for _, tc := range []struct {
		kind Kind
		text string
	}{
		{KindInt4, "1.5"}, {KindInt8, ""}, {KindBool, "yes"}, {KindDate, "2024-1-1"},
		{KindTimestamp, "2024-01-01"}, {KindTimestampTZ, "2024-01-01 10:00:00"},
		{KindBytea, "00ff"}, {KindTime, "25"}, {KindFloat8, "one"},
	} {
		if got, err := AppendValue(nil, Type{Kind: tc.kind}, []byte(tc.text)); err == nil {
			t.Errorf("%s %q: accepted as %s", tc.kind, tc.text, got)
		}
	}
	if _, err := AppendValue(nil, Type{Kind: KindInt4, Dims: 1}, []byte("{1,2")); err == nil {
		t.Error("unterminated array accepted")
	}
}

// The calendar conversions agree with Go's time package across the range
// time.Time formats (years 1..9999).
func TestCalendarAgreesWithTimePackage(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		days := rng.Int64N(3652059) - 719162 // 0001-01-01 .. 9999-12-31
		tm := time.Unix(days*86400, 0).UTC()
		if got := daysFromCivil(int64(tm.Year()), int64(tm.Month()), int64(tm.Day())); got != days {
			t.Fatalf("daysFromCivil(%s) = %d, want %d", tm.Format(time.DateOnly), got, days)
		}
		us := days*MicrosPerDay + rng.Int64N(MicrosPerDay)
		want := time.UnixMicro(us).UTC().Format("2006-01-02T15:04:05.999999Z")
		if got := string(AppendMicrosISO(nil, us)); got != want {
			t.Fatalf("AppendMicrosISO(%d) = %s, want %s", us, got, want)
		}
	}
}

func FuzzAppendValue(f *testing.F) {
	f.Add(uint8(0), false, []byte("{1,2,NULL}"))
	f.Add(uint8(3), false, []byte("2024-02-29 23:59:59.12+00"))
	f.Fuzz(func(t *testing.T, kind uint8, array bool, text []byte) {
		kinds := []Kind{KindInt4, KindFloat8, KindText, KindTimestampTZ, KindTimestamp, KindDate,
			KindTime, KindBytea, KindBool, KindMoney, KindNumeric}
		typ := Type{Kind: kinds[int(kind)%len(kinds)]}
		if array {
			typ.Dims = 1
		}
		got, err := AppendValue(nil, typ, text)
		if err == nil && !json.Valid(got) {
			t.Fatalf("%s %q produced invalid JSON %s", typ.Kind, text, got)
		}
	})
}

func TestParseMicrosISOInvertsAppend(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	lo, hi := daysFromCivil(1, 1, 1)*MicrosPerDay, daysFromCivil(10000, 1, 1)*MicrosPerDay
	for i := 0; i < 100000; i++ {
		us := lo + rng.Int64N(hi-lo)
		if i%3 == 0 {
			us -= us % 1000000 // no fraction
		}
		if got, ok := ParseMicrosISO(AppendMicrosISO(nil, us)); !ok || got != us {
			t.Fatalf("ParseMicrosISO(%s) = %d, %t; want %d", AppendMicrosISO(nil, us), got, ok, us)
		}
	}
	for _, s := range []string{"0000-12-31T23:59:59Z", "10000-01-01T00:00:00Z", "2023-02-29T00:00:00Z", "2024-04-31T00:00:00Z",
		"2024-01-01T24:00:00Z", "2024-01-01T23:60:00Z", "2024-01-01T23:59:60Z", "2024-01-01T00:00:00.Z",
		"2024-01-01T00:00:00.1234567Z", "2024-01-01 00:00:00Z", "2024-01-01T00:00:00", "2024-01-01T00:00:00+00:00"} {
		if us, ok := ParseMicrosISO([]byte(s)); ok {
			t.Errorf("ParseMicrosISO(%s) = %d, want refused", s, us)
		}
	}
}

// FuzzParseMicrosISO: what ParseMicrosISO accepts is the instant Go's
// time package reads from the same text.
func FuzzParseMicrosISO(f *testing.F) {
	f.Add([]byte("2024-02-29T23:59:59.123456Z"))
	f.Add([]byte("0001-01-01T00:00:00Z"))
	f.Fuzz(func(t *testing.T, s []byte) {
		us, ok := ParseMicrosISO(s)
		if !ok {
			return
		}
		tm, err := time.Parse("2006-01-02T15:04:05.999999Z", string(s))
		if err != nil || tm.UnixMicro() != us {
			t.Fatalf("ParseMicrosISO(%q) = %d; time.Parse: %v, %v", s, us, tm.UnixMicro(), err)
		}
	})
}
