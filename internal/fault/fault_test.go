package fault

import "testing"

func TestDidYouMean(t *testing.T) {
	known := []string{"SELECT", "WITH", "FROM", "batch_interval", "publish_interval", "orders", "order_items"}
	for word, want := range map[string]string{
		"SELEC":         " (did you mean SELECT?)",
		"selcet":        " (did you mean SELECT?)",
		"WTIH":          " (did you mean WITH?)",
		"batch_intervl": " (did you mean batch_interval?)",
		"ordrs":         " (did you mean orders?)",
		"order_item":    " (did you mean order_items?)",
		"select":        "", // known, in another case
		"UPDATE":        "",
		"customers":     "",
		"x":             "",
		"publish_every": "",
	} {
		if got := DidYouMean(word, known); got != want {
			t.Errorf("DidYouMean(%q) = %q, want %q", word, got, want)
		}
	}
}
