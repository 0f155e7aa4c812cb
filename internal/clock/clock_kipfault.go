//go:build kipfault

package clock

import (
	"fmt"
	"os"
	"time"
)

// now is the time Env names, fixed for the whole run, or time.Now without it.
func now() time.Time {
	v := os.Getenv(Env)
	if v == "" {
		return time.Now()
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		panic(fmt.Sprintf("%s=%q: want an RFC 3339 time: %v", Env, v, err))
	}
	return t
}
