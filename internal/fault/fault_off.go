//go:build !kipfault

package fault

import (
	"context"
	"time"

	"k8s.io/client-go/rest"
)

// WrapConfig makes the clients built from cfg count their writes; kip as shipped counts nothing.
func WrapConfig(*rest.Config) {}

// Remote counts a remote command that ended; kip as shipped counts nothing.
func Remote(string, string) {}

// Uncounted marks ctx's API requests as not counted; kip as shipped counts nothing.
func Uncounted(ctx context.Context) context.Context { return ctx }

// Bookkeeping marks ctx's writes as the command's bookkeeping; kip as shipped counts nothing.
func Bookkeeping(ctx context.Context) context.Context { return ctx }

// Interval is how often kip's waits ask again: def, in kip as shipped.
func Interval(def time.Duration) time.Duration { return def }

// Pinned is the version a test pins for component name instead of this kip's; kip as shipped
// has none.
func Pinned(string) (string, bool) { return "", false }
