package served

import (
	"crypto/sha256"
	"strings"
	"testing"
	"time"
)

func TestReportRoundTrip(t *testing.T) {
	r := Report{At: time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC), How: HowReload, Keys: map[string]string{"a.conf": ID([]byte("a"))}}
	s, err := r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(s)
	if err != nil || !got.At.Equal(r.At) || got.How != r.How || got.Keys["a.conf"] != r.Keys["a.conf"] {
		t.Fatalf("%q → %+v %v", s, got, err)
	}
	if len(r.Keys["a.conf"]) != IDLen || r.Keys["a.conf"] != IDOfSum(sha256.Sum256([]byte("a"))) {
		t.Fatalf("ID %q: want %d hex digits, the same as IDOfSum", r.Keys["a.conf"], IDLen)
	}
	for _, bad := range []string{"", "{", `{"how":"maybe","keys":{}}`} {
		if _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), Annotation) {
			t.Errorf("Parse(%q) = %v, want an error naming the annotation", bad, err)
		}
	}
}
