package lab

import (
	"context"
	"testing"
	"time"

	"kipper.run/kip/test/need"
)

// ForTest brings up a lab of n hosts for one test (within 10 minutes, logging to the test) and
// removes it when the test and its subtests end. Without the lab's tools the test skips locally
// and fails under CI=true.
func ForTest(t testing.TB, n int, opts Options) *Lab {
	t.Helper()
	need.Lab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	l, err := Up(ctx, n, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return l
}
