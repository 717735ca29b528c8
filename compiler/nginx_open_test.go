package compiler

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// sseChunk is one streamed chat completion event (vLLM's shape).
const sseChunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}` + "\n\n"

// sseLast ends a streamed chat completion.
const sseLast = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"

// cutBackend answers each request with a streamed chat completion: a
// first event at once, then it waits for end: true finishes the stream
// ([DONE]), false kills the connection mid-stream (a backend that dies).
// sent receives the time right before the backend writes its last byte.
// A test that fails early ends the handlers still waiting.
func cutBackend(t *testing.T, end <-chan bool, sent chan<- time.Time) *backend {
	done := make(chan struct{})
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sseChunk)
		w.(http.Flusher).Flush()
		var finish bool
		select {
		case finish = <-end:
		case <-done:
			return
		}
		if finish {
			sent <- time.Now()
			io.WriteString(w, sseLast)
			return
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		sent <- time.Now()
		conn.Close()
	})
	t.Cleanup(func() { close(done) }) // before the backend's Close
	return be
}

// pushBackend pushes route's table with backend be (serial).
func pushBackend(t *testing.T, n *nginxtest.Nginx, c *http.Client, route *Route, be *backend, serial int64) {
	t.Helper()
	_, full := holdOutputs(t, n, route, Snapshot{Backends: []Endpoint{be.endpoint(t)}}, true)
	ft, err := peers.Parse(full)
	if err != nil {
		t.Fatal(err)
	}
	push(t, c, ft, full, serial)
}

// openStream posts a streamed chat completion to url and returns the
// response once its first event arrived (the caller reads the rest).
func openStream(t *testing.T, url string) (*http.Response, *bufio.Reader) {
	t.Helper()
	resp, err := (&http.Client{Timeout: time.Minute}).Post(url+"v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"qwen","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("the stream's first event: %q %v", line, err)
	}
	return resp, br
}

// waitDemand polls route's demand until ok says it is as wanted.
func waitDemand(t *testing.T, c *http.Client, route, what string, ok func(demandEntry) bool) demandEntry {
	t.Helper()
	var d demandEntry
	testbin.WaitUntil(t, 10*time.Second, 20*time.Millisecond, fmt.Sprintf("route %s's demand %s", route, what), func() string {
		if d, _ = demandOf(t, c, route); ok(d) {
			return ""
		}
		return fmt.Sprintf("demand %+v", d)
	})
	return d
}

// TestNginxHoldOpenStream: a streamed answer on a scale-to-zero route is
// open from its request to its end — the demand report and the gauge say
// open=1 while it streams (long after its request arrived) and open=0
// after, with the end's time, not the arrival's.
func TestNginxHoldOpenStream(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	route := holdRoute("zs", "30s", nil)
	installHold(t, n, c, route)
	end, sent := make(chan bool, 1), make(chan time.Time, 1)
	pushBackend(t, n, c, route, cutBackend(t, end, sent), 2)

	_, br := openStream(t, n.URL("zs"))
	d := waitDemand(t, c, "zs", "open=1", func(d demandEntry) bool { return d.Open == 1 })
	if d.LastRequest == 0 || d.LastEnd != 0 {
		t.Errorf("demand while streaming: %+v, want a last request and no end yet", d)
	}
	if got := metricValue(t, n, `autoconfig_engine_open_requests{route="zs"}`); got != "1" {
		t.Errorf("open gauge while streaming %q, want 1", got)
	}
	time.Sleep(300 * time.Millisecond)
	if d, _ := demandOf(t, c, "zs"); d.Open != 1 {
		t.Fatalf("the stream is still open, demand %+v", d)
	}
	end <- true
	endAt := <-sent
	if rest, err := io.ReadAll(br); err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the stream's end: %q %v", rest, err)
	}
	d = waitDemand(t, c, "zs", "open=0", func(d demandEntry) bool { return d.Open == 0 })
	// ngx.now() has millisecond resolution.
	if d.LastEnd < float64(endAt.UnixMilli())/1000 || d.LastEnd < d.LastRequest+0.3 || d.LastEnd > float64(time.Now().UnixMilli())/1000+0.001 {
		t.Errorf("demand after the stream: %+v, want last_end ≥ %.3f (the backend's last byte) and ≥ last_request + 0.3 s", d, float64(endAt.UnixMilli())/1000)
	}
	if got := metricValue(t, n, `autoconfig_engine_open_requests{route="zs"}`); got != "0" {
		t.Errorf("open gauge after the stream %q, want 0", got)
	}
	if got := metricValue(t, n, `autoconfig_engine_streams_cut_total{route="zs",reason="upstream"}`); got != "" {
		t.Errorf("a stream that ended counted as cut: %q", got)
	}

	// A held request is open too, and a refusal gives its count back.
	installHold(t, n, c, holdRoute("zr", "1s", nil))
	if a := nginxtest.PostChat(n.URL("zr")); a.Code != 503 {
		t.Fatalf("a hold that timed out: %d", a.Code)
	}
	// The log phase runs after the client has the answer: wait for it.
	waitDemand(t, c, "zr", "open 0 and its end a hold_timeout after its request", func(d demandEntry) bool {
		return d.Open == 0 && d.LastEnd >= d.LastRequest+0.9
	})
}

// TestNginxStreamCut: a streamed answer whose backend dies mid-stream
// counts in autoconfig_engine_streams_cut_total{reason="upstream"}, on
// any route (this one does not hold); one that ends does not, and one
// whose client goes away counts reason "client".
func TestNginxStreamCut(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	route := holdRoute("zc", "", nil)
	route.Spec.ScaleToZero = nil
	end, sent := make(chan bool, 1), make(chan time.Time, 1)
	be := cutBackend(t, end, sent)
	conf, full := holdOutputs(t, n, route, Snapshot{Backends: []Endpoint{be.endpoint(t)}}, true)
	installDynamic(t, n, "zc", conf)
	ft, err := peers.Parse(full)
	if err != nil {
		t.Fatal(err)
	}
	push(t, c, ft, full, 1)
	upstream := `autoconfig_engine_streams_cut_total{route="zc",reason="upstream"}`
	client := `autoconfig_engine_streams_cut_total{route="zc",reason="client"}`

	// A stream that ends.
	_, br := openStream(t, n.URL("zc"))
	end <- true
	<-sent
	io.ReadAll(br)
	// A stream whose backend dies.
	_, br = openStream(t, n.URL("zc"))
	end <- false
	<-sent
	rest, _ := io.ReadAll(br)
	if strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the cut stream ended: %q", rest)
	}
	waitMetric(t, n, upstream, "1")
	// A stream whose client goes away.
	resp, _ := openStream(t, n.URL("zc"))
	resp.Body.Close()
	waitMetric(t, n, client, "1")
	end <- true
	<-sent
	if got := metricValue(t, n, upstream); got != "1" {
		t.Errorf("%s = %q after a stream that ended and one whose client left, want 1", upstream, got)
	}
}

// waitMetric waits until series has value want.
func waitMetric(t *testing.T, n *nginxtest.Nginx, series, want string) {
	t.Helper()
	testbin.WaitUntil(t, 10*time.Second, 20*time.Millisecond, series+" = "+want, func() string {
		if got := metricValue(t, n, series); got != want {
			return fmt.Sprintf("%s = %q", series, got)
		}
		return ""
	})
}

// TestNginxHoldOpenVideo: a video route that holds counts its requests
// open the same way (its route file has the engine's log phase).
func TestNginxHoldOpenVideo(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	route := videoRoute("zv", nil, backendTier)
	route.Spec.ScaleToZero = holdRoute("zv", "30s", nil).Spec.ScaleToZero
	installHold(t, n, c, route)
	live := newStreamBackend(t, "live")
	pushBackend(t, n, c, route, live.backend, 2)
	resp, err := http.Get(n.URL("zv") + "stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "live begin\n" {
		t.Fatalf("the video stream's start: %q %v", line, err)
	}
	waitDemand(t, c, "zv", "open=1", func(d demandEntry) bool { return d.Open == 1 })
	close(live.release)
	io.ReadAll(br)
	d := waitDemand(t, c, "zv", "open=0", func(d demandEntry) bool { return d.Open == 0 })
	if d.LastEnd < d.LastRequest {
		t.Errorf("demand after the video stream: %+v, want its end", d)
	}
}
