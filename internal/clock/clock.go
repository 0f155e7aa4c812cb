// Package clock is the time kip decides by where a condition lasts hours or days (how long a pod
// has been Ready, a day since a move): time.Now, except in a binary built with -tags kipfault,
// where KIP_FAULT_NOW moves it, so that a test can see a condition turn true without waiting for
// it (see docs/testing.md).
package clock

import "time"

// Env is the variable that sets the time in a binary built with -tags kipfault: an RFC 3339
// time, which the clock keeps for the whole run, so that what a test sees decided at that time
// does not depend on how long the run takes.
const Env = "KIP_FAULT_NOW"

// Now is the time.
func Now() time.Time { return now() }
