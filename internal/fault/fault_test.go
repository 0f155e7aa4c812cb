//go:build kipfault

package fault_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
)

// helperEnv, set, makes the test binary the helper process: it makes the requests of requests
// against the server at its value, and counts a remote command of two lines (a script) after the third.
const helperEnv = "KIP_FAULT_TEST_SERVER"

// requests are the helper's requests, in order, with the status the server answers each with;
// the third, fifth, eighth and ninth are writes (the sixth is made with an Uncounted context,
// the ninth with a Bookkeeping one).
var requests = []struct {
	method, path string
	status       int
	ctx          func(context.Context) context.Context
}{
	{http.MethodGet, "/api/v1/namespaces/a/pods", 200, nil},
	{http.MethodPost, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", 201, nil},
	{http.MethodPost, "/api/v1/namespaces/a/pods", 201, nil},
	{http.MethodPost, "/api/v1/namespaces/a/pods?dryRun=All", 201, nil},
	{http.MethodPatch, "/api/v1/persistentvolumes/pv-1", 200, nil},
	{http.MethodPut, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kip-lock", 200, fault.Uncounted},
	{http.MethodPut, "/api/v1/namespaces/a/configmaps/c", 409, nil},
	{http.MethodDelete, "/api/v1/namespaces/a/pods/p", 200, nil},
	{http.MethodPut, "/api/v1/namespaces/a/configmaps/progress", 200, fault.Bookkeeping},
}

func TestMain(m *testing.M) {
	if url := os.Getenv(helperEnv); url != "" {
		if err := helper(url); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helper(url string) error {
	cfg := &rest.Config{Host: url}
	fault.WrapConfig(cfg)
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	for i, r := range requests {
		ctx := context.Background()
		if r.ctx != nil {
			ctx = r.ctx(ctx)
		}
		req, err := http.NewRequestWithContext(ctx, r.method, url+r.path, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		fmt.Fprintf(os.Stderr, "answered %s %s\n", r.method, r.path)
		if i == 2 {
			fault.Remote("root@h:22", "touch /x\ntouch /y")
			fmt.Fprintln(os.Stderr, "ran the script")
		}
	}
	return nil
}

// server answers the helper's requests as requests says.
func server(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		for _, r := range requests {
			if path, _, _ := strings.Cut(r.path, "?"); r.method == req.Method && path == req.URL.Path &&
				strings.Contains(r.path, "?") == (req.URL.RawQuery != "") {
				w.WriteHeader(r.status)
				return
			}
		}
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// run runs the helper with kill, the environment that has it killed after a write ("": none),
// and returns its standard error, its signal and the writes it logged.
func run(t *testing.T, kill string) (string, syscall.Signal, string) {
	t.Helper()
	srv := server(t)
	writes := filepath.Join(t.TempDir(), "writes")
	env := []string{helperEnv + "=" + srv.URL, fault.WritesFileEnv + "=" + writes}
	if kill != "" {
		env = append(env, kill)
	}
	r := faulttest.Run(t, time.Minute, env...)
	logged, err := os.ReadFile(writes)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return r.Stderr, r.Signal, string(logged)
}

func TestWritesCountedAndLogged(t *testing.T) {
	stderr, sig, logged := run(t, "")
	want := "1\tAPI POST /api/v1/namespaces/a/pods\n" +
		"2\tssh root@h:22: touch /x touch /y\n" +
		"3\tAPI PATCH /api/v1/persistentvolumes/pv-1\n" +
		"4\tAPI DELETE /api/v1/namespaces/a/pods/p\n" +
		"5\tAPI PUT /api/v1/namespaces/a/configmaps/progress\n"
	if sig != 0 || logged != want {
		t.Errorf("uninterrupted: signal %v, logged\n%s\nwant\n%s\nstderr:\n%s", sig, logged, want, stderr)
	}
}

func TestKilledRightAfterTheWrite(t *testing.T) {
	for _, tc := range []struct {
		kill       int
		last, what string
	}{
		{1, "answered POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "API POST /api/v1/namespaces/a/pods"},
		{2, "answered POST /api/v1/namespaces/a/pods", "ssh root@h:22: touch /x touch /y"},
		{3, "answered POST /api/v1/namespaces/a/pods?dryRun=All", "API PATCH /api/v1/persistentvolumes/pv-1"},
		{4, "answered PUT /api/v1/namespaces/a/configmaps/c", "API DELETE /api/v1/namespaces/a/pods/p"},
	} {
		stderr, sig, logged := run(t, faulttest.KillAfter(tc.kill))
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		wantKill := fmt.Sprintf("kipfault: SIGKILL after write %d: %s", tc.kill, tc.what)
		if sig != syscall.SIGKILL || len(lines) < 2 || lines[len(lines)-1] != wantKill || lines[len(lines)-2] != tc.last {
			t.Errorf("killed after write %d: signal %v, stderr\n%s\nwant its last lines %q, %q", tc.kill, sig, stderr, tc.last, wantKill)
		}
		if n := strings.Count(logged, "\n"); n != tc.kill {
			t.Errorf("killed after write %d: %d writes logged:\n%s", tc.kill, n, logged)
		}
	}
}

func TestKilledAfterTheFirstMatchingWrite(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		n       int
		what    string
	}{
		{`^ssh `, 2, "ssh root@h:22: touch /x touch /y"},
		{`^API (PATCH|DELETE) `, 3, "API PATCH /api/v1/persistentvolumes/pv-1"},
		{`/pods/p$`, 4, "API DELETE /api/v1/namespaces/a/pods/p"},
	} {
		stderr, sig, logged := run(t, faulttest.KillAfterMatching(tc.pattern))
		r := faulttest.Result{Stderr: stderr, Signal: sig}
		if what := faulttest.KilledMatching(t, r, tc.pattern); what != tc.what || faulttest.Killed(t, r, tc.n) != tc.what {
			t.Errorf("killed after the first write matching %q: %q, want write %d, %q", tc.pattern, what, tc.n, tc.what)
		}
		if n := strings.Count(logged, "\n"); n != tc.n {
			t.Errorf("killed after the first write matching %q: %d writes logged:\n%s", tc.pattern, n, logged)
		}
	}
	if _, sig, logged := run(t, faulttest.KillAfterMatching(`^API GET `)); sig != 0 || strings.Count(logged, "\n") != 5 {
		t.Errorf("a pattern no write matches: signal %v, logged\n%s", sig, logged)
	}
}

// TestKilledAfterEachNewWrite runs the helper again and again with the same file of writes made:
// each run repeats the writes of the runs before it and is killed after the next, until one ends
// by itself, having made one write more than the run before it; the bookkeeping write, made
// by every run, is never the one killed after.
func TestKilledAfterEachNewWrite(t *testing.T) {
	srv := server(t)
	dir := t.TempDir()
	writes := filepath.Join(dir, "writes")
	env := []string{helperEnv + "=" + srv.URL, fault.WritesFileEnv + "=" + writes, fault.KillNewWriteEnv + "=" + filepath.Join(dir, "made")}
	want := []string{"API POST /api/v1/namespaces/a/pods", "ssh root@h:22: touch /x touch /y",
		"API PATCH /api/v1/persistentvolumes/pv-1", "API DELETE /api/v1/namespaces/a/pods/p"}
	for i, what := range want {
		r := faulttest.Run(t, time.Minute, env...)
		if got := faulttest.Killed(t, r, i+1); got != what {
			t.Fatalf("run %d killed after write %d, %q; want %q", i+1, i+1, got, what)
		}
	}
	if r := faulttest.Run(t, time.Minute, env...); r.Signal != 0 {
		t.Fatalf("the run after each write was killed once: signal %v\n%s", r.Signal, r.Stderr)
	}
	logged, err := os.ReadFile(writes)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(logged), "\n"); n != 1+2+3+4+5 {
		t.Errorf("the runs logged %d writes, want 15:\n%s", n, logged)
	}
}

func TestInterval(t *testing.T) {
	if got := fault.Interval(time.Second); got != time.Second {
		t.Errorf("without %s: %s", fault.PollEnv, got)
	}
	t.Setenv(fault.PollEnv, "50ms")
	if got := fault.Interval(time.Second); got != 50*time.Millisecond {
		t.Errorf("%s=50ms: %s", fault.PollEnv, got)
	}
	t.Setenv(fault.PollEnv, "often")
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "want a positive duration") {
			t.Errorf("%s=often: recovered %v, want a panic naming what it wants", fault.PollEnv, r)
		}
	}()
	fault.Interval(time.Second)
}
