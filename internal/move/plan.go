package move

import (
	"time"

	"kipper.run/kip/internal/mover"
)

// The spec's downtime estimate for a move: copying and verifying together at 10 MiB/s, 3 ms for
// each file and directory, and three minutes for stopping, detaching and starting.
const (
	estimateRate     = 10 << 20 // bytes per second
	estimatePerEntry = 3 * time.Millisecond
	estimateFixed    = 3 * time.Minute
)

// downtime is how long a move of a volume holding t keeps its service stopped, by the spec's
// estimate.
func downtime(t mover.Totals) time.Duration {
	copyVerify := time.Duration(float64(t.Bytes) / estimateRate * float64(time.Second))
	return copyVerify + time.Duration(t.Entries())*estimatePerEntry + estimateFixed
}

const gib = 1 << 30

// plannedSize is the size of a move's new volume: the data's size plus 20%, rounded up to whole
// GiB, at least 1 GiB; a larger declared size is kept.
func plannedSize(data, declared int64) int64 {
	return max(roundUpGiB(data+data/5), gib, declared)
}

// grownSize is the size a move grows its new volume to, once, when the copy runs out of room: a
// quarter more than planned or 30% more than the data, whichever is larger, in whole GiB.
func grownSize(planned, data int64) int64 {
	return roundUpGiB(max(planned+planned/4, data+data*3/10))
}

func roundUpGiB(n int64) int64 { return (n + gib - 1) / gib * gib }
