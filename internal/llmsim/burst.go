package llmsim

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// BurstStats is what a Burst measured.
type BurstStats struct {
	// Admitted, Refused: the measured requests answered, and refused
	// with 503; Failed: the requests neither answered nor refused.
	Admitted, Refused, Failed int
	// Rates are the admitted streams' decode rates (tokens/s), Refusal
	// how long each refusal took.
	Rates   []float64
	Refusal []time.Duration
	// Decoded is the tokens the pods decoded within the measured window.
	Decoded int
	// FirstErr is the first failure's status and error.
	FirstErr string
}

// Burst runs clients concurrent clients against url over c, each sending
// the chat requests req(client, i) back to back for warm+measure: the
// overload the engine's decode SLO admission is measured under. Only the
// requests that start after warm and end within the window count; pods'
// counters are reset when the window opens. A refused client asks again
// 100 ms later (Retry-After says 1 s: coming back sooner is the harder
// case for the engine). ctx ends the burst early, and a failure after it
// ended is not counted.
func Burst(ctx context.Context, c *http.Client, url string, pods Pods, clients int, warm, measure time.Duration, req func(client, i int) ChatRequest) BurstStats {
	var mu sync.Mutex
	var st BurstStats
	from := time.Now().Add(warm)
	until := from.Add(measure)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sleepUntil(ctx, from)
		pods.Reset()
		sleepUntil(ctx, until)
		for _, s := range pods.Stats() {
			st.Decoded += s.DecodedTokens
		}
	}()
	for cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(until) && ctx.Err() == nil; i++ {
				t0 := time.Now()
				res := Chat(ctx, c, url, req(cl, i), nil)
				end := time.Now()
				counted := t0.After(from) && end.Before(until)
				mu.Lock()
				switch {
				case res.Status == http.StatusServiceUnavailable:
					if counted {
						st.Refused++
						st.Refusal = append(st.Refusal, end.Sub(t0))
					}
				case res.Err != nil || res.Status != http.StatusOK:
					if ctx.Err() == nil {
						st.Failed++
						if st.FirstErr == "" {
							st.FirstErr = fmt.Sprintf("client %d: %d %v", cl, res.Status, res.Err)
						}
					}
				case counted:
					st.Admitted++
					st.Rates = append(st.Rates, res.DecodeRate)
				}
				mu.Unlock()
				if res.Status == http.StatusServiceUnavailable {
					sleepUntil(ctx, time.Now().Add(100*time.Millisecond))
				}
			}
		}()
	}
	wg.Wait()
	return st
}

// sleepUntil sleeps until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
}
