package longhorn

import (
	"reflect"
	"strings"
	"testing"
)

// TestJudge decides how a workload's data stands without one node: current when another node
// holds a current replica of every volume, stale when some volume has only older replicas elsewhere,
// only-there when some volume has no replica elsewhere, whatever its other volumes hold.
func TestJudge(t *testing.T) {
	cur := func(node string) Replica { return Replica{Node: node, Current: true} }
	old := func(node string) Replica { return Replica{Node: node} }
	vol := func(replicas ...Replica) VolumeReplicas {
		return VolumeReplicas{Claim: "data", Volume: "pvc-1", Replicas: replicas}
	}
	for _, tt := range []struct {
		name    string
		vols    []VolumeReplicas
		verdict string
		on      []string
	}{
		{"a current copy elsewhere", []VolumeReplicas{vol(cur("w1"), cur("srv"))}, DataCurrent, []string{"srv"}},
		{"two volumes, current on the same node", []VolumeReplicas{vol(cur("w1"), cur("srv"), cur("w2")), vol(cur("w1"), cur("w2"))}, DataCurrent, []string{"w2"}},
		{"two volumes, current on different nodes", []VolumeReplicas{vol(cur("w1"), cur("srv")), vol(cur("w1"), cur("w2"))}, DataCurrent, nil},
		{"only an older copy elsewhere", []VolumeReplicas{vol(cur("w1"), old("srv"))}, DataStale, nil},
		{"only on the worker", []VolumeReplicas{vol(cur("w1"))}, DataOnlyThere, nil},
		{"an unscheduled copy does not count", []VolumeReplicas{vol(cur("w1"), Replica{Current: true})}, DataOnlyThere, nil},
		{"one volume only there outweighs a stale one", []VolumeReplicas{vol(cur("w1"), old("srv")), vol(cur("w1"))}, DataOnlyThere, nil},
		{"no volume", nil, DataCurrent, nil},
	} {
		if got := Judge(tt.vols, "w1"); got != tt.verdict {
			t.Errorf("%s: Judge = %s, want %s", tt.name, got, tt.verdict)
		}
		if got := CurrentOn(tt.vols, "w1"); !reflect.DeepEqual(got, tt.on) {
			t.Errorf("%s: CurrentOn = %v, want %v", tt.name, got, tt.on)
		}
	}
	// Once the worker is back (nothing gone), its own current replica counts.
	if got := Judge([]VolumeReplicas{vol(cur("w1"), old("srv"))}, ""); got != DataCurrent {
		t.Errorf("Judge with nothing gone = %s, want current", got)
	}
	lines := Describe([]VolumeReplicas{vol(Replica{Node: "srv", HealthyAt: "2026-12-01T10:00:00Z", FailedAt: "2026-12-01T11:00:00Z"})})
	want := "claim data (Longhorn volume pvc-1) on srv: not current (healthy at 2026-12-01T10:00:00Z, last healthy at never, failed at 2026-12-01T11:00:00Z, last failed at never)"
	if len(lines) != 1 || lines[0] != want {
		t.Errorf("Describe = %q, want %q", lines, want)
	}
}

// TestDistrust takes "current" back only from the copies elsewhere of the volumes whose engine
// ran on the cut-off worker: the worker's own copy and other volumes keep Longhorn's verdict, and
// the judgement turns stale.
func TestDistrust(t *testing.T) {
	vols := []VolumeReplicas{
		{Claim: "data", Volume: "v1", Replicas: []Replica{{Node: "w1", Current: true}, {Node: "srv", Current: true}}},
		{Claim: "dump", Volume: "v2", Replicas: []Replica{{Node: "w1", Current: true}, {Node: "srv", Current: true}}},
	}
	if got := Judge(vols, "w1"); got != DataCurrent {
		t.Fatalf("before: %s", got)
	}
	Distrust(vols, []string{"v1"}, "w1")
	if vols[0].Replicas[1].Current || vols[0].Replicas[1].Unsure == "" || !vols[0].Replicas[0].Current || vols[0].Replicas[0].Unsure != "" ||
		!vols[1].Replicas[1].Current {
		t.Errorf("after: %+v", vols)
	}
	if got := Judge(vols, "w1"); got != DataStale {
		t.Errorf("judged %s, want %s", got, DataStale)
	}
	if s := vols[0].Replicas[1].String(); !strings.HasPrefix(s, "on srv: not known to be current: its engine ran on w1, which could not reach the server") {
		t.Errorf("String() = %q", s)
	}
}
