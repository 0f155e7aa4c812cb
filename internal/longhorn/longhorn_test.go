package longhorn

import (
	"reflect"
	"strings"
	"testing"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestWorkerReplicas lists the volumes without a current replica on the server: one replica on a
// worker, replicas on two workers, a replica on the server that failed; not a volume with a
// current replica on the server beside one on a worker, nor one without replicas.
func TestWorkerReplicas(t *testing.T) {
	vol := func(name, claim string) longhornv1beta2.Volume {
		v := longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if claim != "" {
			v.Status.KubernetesStatus = longhornv1beta2.KubernetesStatus{Namespace: "shop-prod", PVCName: claim}
		}
		return v
	}
	rep := func(vol, node string, current bool) longhornv1beta2.Replica {
		r := longhornv1beta2.Replica{}
		r.Spec.VolumeName, r.Spec.NodeID, r.Spec.HealthyAt = vol, node, "2026-12-01T10:00:00Z"
		if !current {
			r.Spec.FailedAt = "2026-12-01T11:00:00Z"
		}
		return r
	}
	vols := []longhornv1beta2.Volume{vol("v-one", "data-db-0"), vol("v-two", ""), vol("v-failed", ""), vol("v-safe", ""), vol("v-none", "")}
	reps := []longhornv1beta2.Replica{
		rep("v-one", "w1", true),
		rep("v-two", "w2", true), rep("v-two", "w1", true),
		rep("v-failed", "srv", false), rep("v-failed", "w1", true),
		rep("v-safe", "srv", true), rep("v-safe", "w2", true),
	}
	got := WorkerReplicas(vols, reps, func(n string) bool { return n == "srv" })
	want := []WorkerReplica{
		{Volume: "v-failed", Nodes: []string{"w1"}},
		{Volume: "v-one", Namespace: "shop-prod", Claim: "data-db-0", Nodes: []string{"w1"}},
		{Volume: "v-two", Nodes: []string{"w1", "w2"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("WorkerReplicas = %+v, want %+v", got, want)
	}
	// w1 alone holds v-one and v-failed (the server's replica failed); v-two and v-safe have a
	// current replica elsewhere.
	if got := OnlyReplicasOn(reps, "w1"); !reflect.DeepEqual(got, []string{"v-failed", "v-one"}) {
		t.Errorf("OnlyReplicasOn(w1) = %v", got)
	}
	if got := OnlyReplicasOn(reps, "srv"); got != nil {
		t.Errorf("OnlyReplicasOn(srv) = %v, want none", got)
	}
	if s := want[1].Sentence(); s != "Longhorn volume v-one (claim shop-prod/data-db-0) has no current copy on the server, only on w1: losing that node can lose its data" {
		t.Errorf("Sentence = %q", s)
	}
}

// TestV1Value reads a Longhorn setting for the v1 data engine, plain or per engine.
func TestV1Value(t *testing.T) {
	for stored, want := range map[string]string{"8": "8", ` 12 `: "12", `{"v1":"10","v2":"8"}`: "10", `{"v2":"8"}`: ""} {
		if got := v1Value(stored); got != want {
			t.Errorf("v1Value(%q) = %q, want %q", stored, got, want)
		}
	}
}

// TestUnpinnedVolumes lists the volumes of one copy with no node selector, with where their copy
// is: not a pinned one, not one the operator gave a selector, not one of two copies.
func TestUnpinnedVolumes(t *testing.T) {
	vol := func(name string, copies int, selector ...string) longhornv1beta2.Volume {
		v := longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}}
		v.Spec.NumberOfReplicas, v.Spec.NodeSelector = copies, selector
		v.Status.KubernetesStatus.Namespace, v.Status.KubernetesStatus.PVCName = "shop", "data-"+name
		return v
	}
	vols := []longhornv1beta2.Volume{vol("b-loose", 1), vol("a-pinned", 1, ServerTag), vol("c-own", 1, "ssd"), vol("d-two", 2), vol("a-new", 1)}
	reps := []longhornv1beta2.Replica{
		{Spec: longhornv1beta2.ReplicaSpec{InstanceSpec: longhornv1beta2.InstanceSpec{VolumeName: "b-loose", NodeID: "w1"}}},
		{Spec: longhornv1beta2.ReplicaSpec{InstanceSpec: longhornv1beta2.InstanceSpec{VolumeName: "a-pinned", NodeID: "srv"}}},
	}
	got := UnpinnedVolumes(vols, reps)
	want := []Unpinned{{Volume: "a-new", Namespace: "shop", Claim: "data-a-new", Nodes: []string{}}, {Volume: "b-loose", Namespace: "shop", Claim: "data-b-loose", Nodes: []string{"w1"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("UnpinnedVolumes = %+v, want %+v", got, want)
	}
	if s := got[1].Sentence(); s != "Longhorn volume b-loose (claim shop/data-b-loose) keeps one copy, on w1, and is not pinned to the server: a rebuild can place it on a worker" {
		t.Errorf("sentence %q", s)
	}
	if s := got[0].Sentence(); !strings.Contains(s, "keeps one copy, on no node yet,") {
		t.Errorf("sentence %q", s)
	}
}
