package testenv

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"

	"kipper.run/kip/internal/kube"
)

// RequestLog counts the API requests of clients CountingClients built, with what each asked.
type RequestLog struct {
	n     atomic.Int64
	mu    sync.Mutex
	paths []string
}

// Take returns the count and the requests since the last Take, and starts again.
func (l *RequestLog) Take() (int64, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	paths := l.paths
	l.paths = nil
	return l.n.Swap(0), paths
}

// CountingClients returns API clients for cfg whose requests l counts: a test bounds how many
// requests a command makes.
func CountingClients(tb testing.TB, cfg *rest.Config) (*kube.Clients, *RequestLog) {
	tb.Helper()
	l := &RequestLog{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			l.n.Add(1)
			l.mu.Lock()
			l.paths = append(l.paths, req.Method+" "+req.URL.RequestURI())
			l.mu.Unlock()
			return rt.RoundTrip(req)
		})
	})
	c, err := kube.NewClients(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return c, l
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
