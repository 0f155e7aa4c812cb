package move

import (
	"testing"
	"time"

	"kipper.run/kip/internal/mover"
)

func TestDowntime(t *testing.T) {
	for _, tc := range []struct {
		totals mover.Totals
		want   time.Duration
	}{
		{mover.Totals{}, 3 * time.Minute},
		// 6 GiB in 1,010 entries: 614.4 s + 3.03 s + 3 min, about 13 minutes (the spec measured 8).
		{mover.Totals{Bytes: 6 << 30, Files: 1000, Directories: 10}, 614400*time.Millisecond + 1010*3*time.Millisecond + 3*time.Minute},
		// 150,000 files of 4 KiB: 58.6 s + 450 s + 3 min, about 11.5 minutes.
		{mover.Totals{Bytes: 150000 * 4096, Files: 150000}, 58593750*time.Microsecond + 450*time.Second + 3*time.Minute},
	} {
		if got := downtime(tc.totals); got != tc.want {
			t.Errorf("downtime(%+v) = %s, want %s", tc.totals, got, tc.want)
		}
	}
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct{ data, declared, planned, grown int64 }{
		{0, 0, gib, 2 * gib},                    // at least 1 GiB; a quarter more, rounded up
		{100 << 20, 0, gib, 2 * gib},            // 120 MiB → 1 GiB
		{gib, 0, 2 * gib, 3 * gib},              // 1.2 GiB → 2 GiB; 2.5 GiB → 3 GiB
		{5 * gib, 0, 6 * gib, 8 * gib},          // 6 GiB; 7.5 GiB vs 6.5 GiB → 8 GiB
		{5 * gib, 10 * gib, 10 * gib, 13 * gib}, // the declared 10 GiB kept; 12.5 GiB → 13 GiB
		{10 * gib, 0, 12 * gib, 15 * gib},       // 12 GiB; 15 GiB vs 13 GiB
		{10*gib + 1, 0, 13 * gib, 17 * gib},     // 12 GiB and a bit → 13 GiB; 16.25 → 17 GiB
	} {
		if got := plannedSize(tc.data, tc.declared); got != tc.planned {
			t.Errorf("plannedSize(%d, %d) = %d, want %d", tc.data, tc.declared, got, tc.planned)
		}
		if got := grownSize(tc.planned, tc.data); got != tc.grown {
			t.Errorf("grownSize(%d, %d) = %d, want %d", tc.planned, tc.data, got, tc.grown)
		}
	}
}
