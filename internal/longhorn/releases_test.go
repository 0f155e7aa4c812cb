package longhorn

import (
	"strings"
	"testing"
)

// TestSteps: one minor at a time, the latest patch of each, from the running release to the
// pinned one; never a skip, a downgrade or a start off the ladder.
func TestSteps(t *testing.T) {
	versions := func(rs []Release) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Version)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct{ running, target, want, err string }{
		{"v1.7.3", "v1.11.3", "v1.8.2 v1.9.2 v1.10.2 v1.11.3", ""},
		{"v1.7.1", "v1.11.3", "v1.8.2 v1.9.2 v1.10.2 v1.11.3", ""},
		{"1.9.2", "v1.11.3", "v1.10.2 v1.11.3", ""},
		{"v1.10.0", "v1.10.2", "v1.10.2", ""},
		{"v1.11.1", "v1.11.3", "v1.11.3", ""},
		{"v1.11.3", "v1.11.3", "", ""},
		{"v1.8.2", "v1.9.2", "v1.9.2", ""},
		{"v1.6.4", "v1.11.3", "", "older than v1.7.3"},
		{"v1.12.0", "v1.11.3", "", "cannot be downgraded"},
		{"v1.11.4", "v1.11.3", "", "cannot be downgraded"},
		{"v1.7.3", "v1.11.2", "", "not a release kip moves clusters to"},
		{"latest", "v1.11.3", "", "not a version"},
	} {
		got, err := Steps(tc.running, tc.target)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Steps(%s, %s) = %q, %v; want an error with %q", tc.running, tc.target, versions(got), err, tc.err)
			}
			continue
		}
		if err != nil || versions(got) != tc.want {
			t.Errorf("Steps(%s, %s) = %q, %v; want %q", tc.running, tc.target, versions(got), err, tc.want)
		}
	}
}

// TestLadder: the ladder is in order, one minor apart, and what spec 002 and the releases say
// of each: 1.10 drops v1beta1 and stores the CPU setting per engine, 1.11 needs Kubernetes 1.34
// and brings the engine's newer API.
func TestLadder(t *testing.T) {
	for i, r := range Ladder {
		if i > 0 {
			prev, _ := LadderRelease(Ladder[i-1].Version)
			if got, ok := LadderRelease(r.Version); !ok || got.Version != r.Version || prev.Version == r.Version {
				t.Errorf("ladder release %s is not its minor's own", r.Version)
			}
		}
	}
	r11, _ := LadderRelease("v1.11.0")
	if r11.KubernetesFloor != "v1.34.0" || r11.CLIAPI != 11 || r11.ControllerAPI != 6 || !r11.CPUPerEngine || r11.V1beta1 != V1beta1Removed {
		t.Errorf("1.11: %+v", r11)
	}
	r9, _ := LadderRelease("v1.9.0")
	if r9.V1beta1 != V1beta1Unserved || r9.CPUPerEngine {
		t.Errorf("1.9: %+v", r9)
	}
	if _, ok := LadderRelease("v1.12.0"); ok {
		t.Error("the ladder has a 1.12")
	}
}
