package longhorn

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// Release is what kip knows of one Longhorn release it moves a cluster through (spec 002,
// "Longhorn upgrades"; the numbers are longhorn-manager's and longhorn-engine's at each tag,
// listed in docs/upgrade.md, "Longhorn's releases").
type Release struct {
	Version string // the release, e.g. v1.8.2
	// KubernetesFloor is the oldest Kubernetes release every node must run for it.
	KubernetesFloor string
	// The engine's CLI and controller API versions the release's engine image reports, and the
	// oldest of each it still drives: an engine in use below them cannot move onto it.
	CLIAPI, CLIAPIMin, ControllerAPI, ControllerAPIMin int
	// CPUPerEngine says the release stores guaranteed-instance-manager-cpu per data engine
	// ({"v1":"12","v2":"12"}); before 1.10 it is a plain percentage.
	CPUPerEngine bool
	// V1beta1 is how the release's CRDs list longhorn.io/v1beta1: served (still stored by
	// objects written through it), unserved, or removed (the CRDs refuse to drop a stored
	// version, so objects still stored as v1beta1 block the step onto it).
	V1beta1 V1beta1State
}

// V1beta1State is how a release's CRDs list longhorn.io/v1beta1.
type V1beta1State string

const (
	V1beta1Served   V1beta1State = "served"
	V1beta1Unserved V1beta1State = "unserved"
	V1beta1Removed  V1beta1State = "removed"
)

// Ladder is the latest patch of each Longhorn minor that kip moves a cluster through, one minor
// at a time, from 1.7.3 (the release earlier kip versions installed) to the release this kip
// pins. Longhorn's manager refuses a skipped minor and a downgrade.
var Ladder = []Release{
	{Version: "v1.7.3", KubernetesFloor: "v1.21.0", CLIAPI: 10, CLIAPIMin: 8, ControllerAPI: 5, ControllerAPIMin: 4, V1beta1: V1beta1Served},
	{Version: "v1.8.2", KubernetesFloor: "v1.25.0", CLIAPI: 10, CLIAPIMin: 8, ControllerAPI: 5, ControllerAPIMin: 4, V1beta1: V1beta1Served},
	{Version: "v1.9.2", KubernetesFloor: "v1.25.0", CLIAPI: 10, CLIAPIMin: 8, ControllerAPI: 5, ControllerAPIMin: 4, V1beta1: V1beta1Unserved},
	{Version: "v1.10.2", KubernetesFloor: "v1.25.0", CLIAPI: 10, CLIAPIMin: 8, ControllerAPI: 5, ControllerAPIMin: 4, CPUPerEngine: true, V1beta1: V1beta1Removed},
	{Version: "v1.11.3", KubernetesFloor: "v1.34.0", CLIAPI: 11, CLIAPIMin: 8, ControllerAPI: 6, ControllerAPIMin: 4, CPUPerEngine: true, V1beta1: V1beta1Removed},
}

// LadderRelease is the ladder's release of version's minor; ok is false when the ladder has
// none.
func LadderRelease(v string) (r Release, ok bool) {
	pv, err := version.ParseSemantic(v)
	if err != nil {
		return Release{}, false
	}
	for _, r := range Ladder {
		if lv := version.MustParseSemantic(r.Version); lv.Major() == pv.Major() && lv.Minor() == pv.Minor() {
			return r, true
		}
	}
	return Release{}, false
}

// Steps are the releases a cluster running Longhorn running goes through to reach target, one
// minor at a time: the ladder's release of each minor after running's, up to target's. None
// when running is target's minor or later at target's patch or later. It refuses a running
// release the ladder does not start from (older than its first minor), a target off the ladder,
// and a downgrade (a running release newer than target).
func Steps(running, target string) ([]Release, error) {
	rv, err := version.ParseSemantic(running)
	if err != nil {
		return nil, fmt.Errorf("the cluster's Longhorn release %q is not a version: %w", running, err)
	}
	tr, ok := LadderRelease(target)
	if !ok || tr.Version != "v"+strings.TrimPrefix(target, "v") {
		return nil, fmt.Errorf("Longhorn %s is not a release kip moves clusters to", target)
	}
	tv := version.MustParseSemantic(tr.Version)
	first := version.MustParseSemantic(Ladder[0].Version)
	switch {
	case rv.Major() != first.Major() || rv.Minor() < first.Minor():
		return nil, fmt.Errorf("the cluster runs Longhorn %s, older than %s, the first release kip moves Longhorn from: upgrade it to %s with Longhorn's own procedure first", running, Ladder[0].Version, Ladder[0].Version)
	case rv.GreaterThan(tv):
		return nil, fmt.Errorf("the cluster runs Longhorn %s, newer than %s, the release this kip pins: Longhorn cannot be downgraded; use a kip that pins %s or later", running, tr.Version, running)
	}
	var steps []Release
	for _, r := range Ladder {
		lv := version.MustParseSemantic(r.Version)
		if lv.Minor() > rv.Minor() && !lv.GreaterThan(tv) {
			steps = append(steps, r)
		}
	}
	if len(steps) == 0 && rv.LessThan(tv) {
		steps = append(steps, tr) // a patch of the target's minor
	}
	return steps, nil
}
