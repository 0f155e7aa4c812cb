//go:build kipfault

package fault

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
)

var (
	mu     sync.Mutex
	writes int
	// made are the writes earlier runs made, by their keys (newWrite), read from
	// KillNewWriteEnv's file at this run's first write.
	made map[string]bool
)

// WrapConfig makes the clients built from cfg count each mutating request the server accepted.
func WrapConfig(cfg *rest.Config) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return counting{rt} })
}

// Remote counts a remote command on host that ended, whatever its exit status.
func Remote(host, cmd string) {
	what := "ssh " + host + ": " + cmd
	wrote(what, what)
}

// Uncounted marks ctx's API requests as not counted: writes whose moment depends on the clock,
// as a lock's renewals do, would make the numbering depend on the machine's speed.
func Uncounted(ctx context.Context) context.Context {
	return context.WithValue(ctx, uncountedKey{}, true)
}

type uncountedKey struct{}

// Bookkeeping marks ctx's writes as the command's own bookkeeping (its cluster lock, its
// progress record): numbered and logged as any write, but never the one KillNewWriteEnv kills
// after, since every run makes them again.
func Bookkeeping(ctx context.Context) context.Context {
	return context.WithValue(ctx, bookkeepingKey{}, true)
}

type bookkeepingKey struct{}

type counting struct{ next http.RoundTripper }

func (c counting) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err == nil && resp.StatusCode < 300 && mutating(req) && req.Context().Value(uncountedKey{}) == nil {
		what := "API " + req.Method + " " + req.URL.Path
		key := what + " " + bodyDigest(req)
		if req.Context().Value(bookkeepingKey{}) != nil {
			key = ""
		}
		wrote(what, key)
	}
	return resp, err
}

// bodyDigest is a digest of req's body, "" when it has none: two writes to one object with
// different bodies (a cordon, an uncordon) are two writes to KillNewWriteEnv.
func bodyDigest(req *http.Request) string {
	if req.GetBody == nil {
		return ""
	}
	body, err := req.GetBody()
	if err != nil {
		return ""
	}
	defer body.Close()
	h := sha256.New()
	if _, err := io.Copy(h, body); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// reviews are the kinds whose creation asks the server a question and stores nothing.
var reviews = []string{"/selfsubjectaccessreviews", "/selfsubjectrulesreviews", "/subjectaccessreviews",
	"/localsubjectaccessreviews", "/tokenreviews"}

// mutating reports whether req may change what the server stores.
func mutating(req *http.Request) bool {
	switch req.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return false
	}
	if req.URL.Query().Has("dryRun") {
		return false
	}
	for _, r := range reviews {
		if strings.HasSuffix(req.URL.Path, r) {
			return false
		}
	}
	return true
}

// wrote numbers a write, logs it to the file WritesFileEnv names, and kills the process when it
// is the write KillWriteEnv names, the first KillWriteMatchingEnv matches, or, by its key (""
// for bookkeeping), one no earlier run made (KillNewWriteEnv).
func wrote(what, key string) {
	mu.Lock()
	defer mu.Unlock()
	writes++
	what = strings.Join(strings.Fields(what), " ")
	if len(what) > 300 {
		what = what[:300] + "…"
	}
	if file := os.Getenv(WritesFileEnv); file != "" {
		f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			_, err = fmt.Fprintf(f, "%d\t%s\n", writes, what)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			panic(fmt.Sprintf("kipfault: log write %d to %s: %v", writes, file, err))
		}
	}
	if killAfter(what) || newWrite(key) {
		fmt.Fprintf(os.Stderr, "kipfault: SIGKILL after write %d: %s\n", writes, what)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught: the process ends here
	}
}

// killAfter reports whether the write just made, what, is the one KillWriteEnv numbers or the
// first KillWriteMatchingEnv matches.
func killAfter(what string) bool {
	if v := os.Getenv(KillWriteEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			panic(fmt.Sprintf("%s=%q: want the number of a write, from 1", KillWriteEnv, v))
		}
		if n == writes {
			return true
		}
	}
	if v := os.Getenv(KillWriteMatchingEnv); v != "" {
		re, err := regexp.Compile(v)
		if err != nil {
			panic(fmt.Sprintf("%s=%q: %v", KillWriteMatchingEnv, v, err))
		}
		return re.MatchString(what)
	}
	return false
}

// newWrite reports whether KillNewWriteEnv names a file and no earlier run made the write whose
// key is key (not bookkeeping): then it adds key to the file, for the runs after this one.
func newWrite(key string) bool {
	file := os.Getenv(KillNewWriteEnv)
	if file == "" || key == "" {
		return false
	}
	// The file holds a digest of each key: a remote command's key is its command line, which a
	// script spreads over several lines.
	sum := sha256.Sum256([]byte(key))
	key = hex.EncodeToString(sum[:16])
	if made == nil {
		data, err := os.ReadFile(file)
		if err != nil && !os.IsNotExist(err) {
			panic(fmt.Sprintf("kipfault: read %s: %v", file, err))
		}
		made = map[string]bool{}
		for _, k := range strings.Split(string(data), "\n") {
			made[k] = true
		}
	}
	if made[key] {
		return false
	}
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = fmt.Fprintln(f, key)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		panic(fmt.Sprintf("kipfault: add write to %s: %v", file, err))
	}
	return true
}

// Interval is how often kip's waits ask again: PollEnv's duration when set, else def.
func Interval(def time.Duration) time.Duration {
	v := os.Getenv(PollEnv)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		panic(fmt.Sprintf("%s=%q: want a positive duration such as 50ms", PollEnv, v))
	}
	return d
}

// Pinned is the version PinEnv gives component name, when it names it.
func Pinned(name string) (string, bool) {
	for _, pin := range strings.Split(os.Getenv(PinEnv), ",") {
		if n, v, ok := strings.Cut(strings.TrimSpace(pin), "="); ok && n == name {
			return v, true
		}
	}
	return "", false
}
