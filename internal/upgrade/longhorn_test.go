package upgrade

import (
	"strings"
	"testing"
)

// TestLonghornPlan: --check lists the Longhorn steps to the pinned release, or says why there
// are none.
func TestLonghornPlan(t *testing.T) {
	for _, tc := range []struct{ runs, pin, want string }{
		{"v1.7.3", "v1.11.3", "Longhorn stays at v1.7.3, the release the cluster runs; this kip pins v1.11.3, reached one minor at a time with kip upgrade --longhorn: v1.8.2, then v1.9.2, then v1.10.2, then v1.11.3"},
		{"v1.10.2", "v1.11.3", "this kip pins v1.11.3, reached one minor at a time with kip upgrade --longhorn: v1.11.3"},
		{"v1.6.4", "v1.11.3", "Longhorn stays at v1.6.4, the release the cluster runs: the cluster runs Longhorn v1.6.4, older than v1.7.3"},
		{"v1.12.0", "v1.11.3", "Longhorn cannot be downgraded"},
	} {
		if got, _ := longhornPlan(tc.runs, tc.pin); !strings.Contains(got, tc.want) {
			t.Errorf("longhornPlan(%s, %s) = %q, want it to contain %q", tc.runs, tc.pin, got, tc.want)
		}
	}
}
