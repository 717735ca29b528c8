package main

import (
	"io"
	"net/http"
	"sync"
)

// DefaultMaxInFlight bounds the controller's API requests in flight at
// once (watches aside: they stay open for as long as they run). The rate
// limit (--kube-api-qps) paces requests over time, not how many are open:
// a cold start sends a finalizer patch for every route at once, and above
// the HTTP/2 streams one connection carries (Go's client assumes 100 until
// the server says otherwise), client-go's transport dials a new TLS
// connection per waiting request. 1000 parallel patches on the scale
// benchmark's API server opened up to 1,400 sockets and took 1.4-1.6 s;
// at most 64 in flight, one connection and 0.6 s. The controller's start
// at 1000 routes held about 1,000 sockets (and their TLS buffers: most of
// its peak memory) before this limit.
const DefaultMaxInFlight = 64

// inFlightLimit is a RoundTripper that lets at most cap(sem) requests be in
// flight, from sending the request until its response body is read to
// the end or closed; watches pass unlimited.
type inFlightLimit struct {
	sem chan struct{}
	rt  http.RoundTripper
}

// limitInFlight returns a rest.Config WrapTransport that bounds the
// requests of every transport it wraps to n in flight together (n ≤ 0:
// no bound).
func limitInFlight(n int) func(http.RoundTripper) http.RoundTripper {
	if n <= 0 {
		return nil
	}
	sem := make(chan struct{}, n)
	return func(rt http.RoundTripper) http.RoundTripper { return &inFlightLimit{sem: sem, rt: rt} }
}

func (l *inFlightLimit) RoundTrip(req *http.Request) (*http.Response, error) {
	if isWatch(req) {
		return l.rt.RoundTrip(req)
	}
	select {
	case l.sem <- struct{}{}:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	release := sync.OnceFunc(func() { <-l.sem })
	resp, err := l.rt.RoundTrip(req)
	if err != nil || resp.Body == nil {
		release()
		return resp, err
	}
	resp.Body = &releasingBody{ReadCloser: resp.Body, release: release}
	return resp, nil
}

// WrappedRoundTripper lets client-go's debugging helpers see through.
func (l *inFlightLimit) WrappedRoundTripper() http.RoundTripper { return l.rt }

// isWatch: a watch request (a long-running stream), which holds no slot.
func isWatch(req *http.Request) bool {
	w := req.URL.Query().Get("watch")
	return w == "true" || w == "1"
}

// releasingBody frees the request's slot once its body is read to the end
// (or fails) or closed, whichever comes first.
type releasingBody struct {
	io.ReadCloser
	release func()
}

func (b *releasingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.release()
	}
	return n, err
}

func (b *releasingBody) Close() error {
	defer b.release()
	return b.ReadCloser.Close()
}
