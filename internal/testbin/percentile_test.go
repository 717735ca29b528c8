package testbin

import (
	"testing"
	"time"
)

func TestPercentileMs(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := PercentileMs(d, 0.5); p != 51 {
		t.Errorf("p50 = %v, want 51", p)
	}
	if p := PercentileMs(d, 0.99); p != 100 {
		t.Errorf("p99 = %v, want 100", p)
	}
	if d[0] != 100*time.Millisecond {
		t.Error("the input was reordered")
	}
	if p := PercentileMs(nil, 0.5); p != 0 {
		t.Errorf("no samples: %v", p)
	}
}
