package status

import (
	"context"
	"maps"
	"strings"
	"testing"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/prune"
	"kipper.run/kip/internal/service"
)

// TestKeptCopiesText: each kept copy with its size, the total, and why it is kept; an orphan and
// a copy free to go with the command that deletes them; a stranded service.
func TestKeptCopiesText(t *testing.T) {
	used := int64(3 << 30)
	r := &Report{
		KeptCopies: []prune.Kept{
			{Volume: "pvc-1", Node: "srv", Path: "/var/lib/rancher/k3s/storage/pvc-1_shop-staging_data-db-0", Kind: prune.KindMoved,
				Service: &service.Ref{Project: "shop", Environment: "staging", Name: "db"}, UsedBytes: &used,
				Holds: []prune.Hold{{Condition: prune.CondReady, Reason: "pod db-0 has been Ready for 23 min of 1 h"},
					{Condition: prune.CondBackup, Reason: "waiting for a completed backup made after the move ('kip backup create'), or until 2026-12-02 14:03"}}},
			{Volume: "pvc-2", Node: "srv", Path: "/p2", Kind: prune.KindOrphan, Namespace: "shop-staging", Claim: "data-old-0", SizeBytes: 1 << 30},
			{Volume: "pvc-3", Node: "srv", Path: "/p3", Kind: prune.KindMoved, Service: &service.Ref{Project: "shop", Environment: "prod", Name: "cache"}, SizeBytes: 1 << 30},
		},
		KeptCopiesBytes: used,
		Stranded:        []Stranded{{Service: service.Ref{Project: "shop", Environment: "prod", Name: "queue"}, Claim: "data-queue-0", Reason: "its claim data-queue-0 is Lost: volume pvc-9 is gone"}},
	}
	var b strings.Builder
	r.writeKeptCopies(&b)
	want := `
Local copies kept after moves to Longhorn (3, 3.0 GiB)
  ! db in shop-staging: volume pvc-1, /var/lib/rancher/k3s/storage/pvc-1_shop-staging_data-db-0 on srv (3.0 GiB)
    kept: pod db-0 has been Ready for 23 min of 1 h
    kept: waiting for a completed backup made after the move ('kip backup create'), or until 2026-12-02 14:03
  ✔ claim shop-staging/data-old-0: volume pvc-2, /p2 on srv (1.0 GiB declared)
    its service and data claim are both gone: 'kip cluster storage prune' deletes it
  ✔ cache in shop-prod: volume pvc-3, /p3 on srv (1.0 GiB declared)
    no longer needed: 'kip cluster storage prune' deletes it

Services stranded by a missing volume
  ✗ queue in shop-prod: its claim data-queue-0 is Lost: volume pvc-9 is gone
`
	if b.String() != want {
		t.Errorf("kept copies:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestLostClaims(t *testing.T) {
	claim := func(name, volume string, phase corev1.PersistentVolumeClaimPhase) corev1.PersistentVolumeClaim {
		return corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop-prod", Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}, Status: corev1.PersistentVolumeClaimStatus{Phase: phase}}
	}
	pvs := []corev1.PersistentVolume{{ObjectMeta: metav1.ObjectMeta{Name: "pv-here"}}}
	got := lostClaims([]corev1.PersistentVolumeClaim{
		claim("ok", "pv-here", corev1.ClaimBound),
		claim("gone", "pv-gone", corev1.ClaimBound),
		claim("lost", "pv-lost", corev1.ClaimLost),
		claim("waiting", "", corev1.ClaimPending),
	}, pvs)
	want := map[string]string{
		"shop-prod/gone": "its claim gone names volume pv-gone, which does not exist",
		"shop-prod/lost": "its claim lost is Lost: volume pv-lost is gone",
	}
	if !maps.Equal(got, want) {
		t.Errorf("lostClaims = %v, want %v", got, want)
	}
}

func TestSSHAddr(t *testing.T) {
	worker := func(name string, addrs ...corev1.NodeAddress) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
	}
	v := &view{workers: cluster.Nodes{Workers: map[string]cluster.Worker{"w1": {Host: "w1.example.com"}}}}
	internal := corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.77.0.21"}
	external := corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.22"}
	for _, tc := range []struct {
		n    corev1.Node
		want string
	}{
		{worker("w1", internal, external), "w1.example.com"},
		{worker("w2", internal, external), "198.51.100.22"},
		{worker("w3", internal), "10.77.0.21"},
	} {
		if got := v.sshAddr(&Options{}, &tc.n); got != tc.want {
			t.Errorf("sshAddr(%s) = %s, want %s", tc.n.Name, got, tc.want)
		}
	}
}

// TestStrandedOnWorkers lists the services stranded on a worker that is not Ready from what
// status read of Longhorn: a service whose volume is attached to the NotReady worker, with the
// nodes that hold a current copy, and a service the fence of another worker stopped; it makes no
// API request when no volume is attached to such a worker and no fence stopped a service (the
// view has no clients here, so a request would fail).
func TestStrandedOnWorkers(t *testing.T) {
	node := func(name string, ready corev1.ConditionStatus, taints ...corev1.Taint) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
	}
	v := &view{nodes: []corev1.Node{node("w1", corev1.ConditionFalse), node("w2", corev1.ConditionTrue)}}
	vol := longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}}
	vol.Status.CurrentNodeID, vol.Status.KubernetesStatus = "w2", longhornv1beta2.KubernetesStatus{Namespace: "shop-prod", PVCName: "data-db-0"}
	v.lhVolumes = []longhornv1beta2.Volume{vol}
	r := &Report{}
	if err := strandedOnWorkers(context.Background(), v, r); err != nil || len(r.Stranded) != 0 {
		t.Errorf("nothing stranded: %+v (%v)", r.Stranded, err)
	}

	ref := service.Ref{Project: "shop", Environment: "prod", Name: "db"}
	s := &service.Service{Ref: ref}
	for _, tt := range []struct {
		st, data  string
		fenceStop string
		on        []string
		want      string
	}{
		{cluster.NodeNotReady, longhorn.DataCurrent, "", []string{"srv"},
			"it has a volume on w1, which is NotReady (current copies of its data are on srv): once you know w1 is down, run kip node fence w1"},
		{cluster.NodeUnknown, longhorn.DataStale, "", nil,
			"it has a volume on w1, which is Unknown (no node but w1 holds a copy of its data known to be current): once you know w1 is down, run kip node fence w1"},
		{cluster.NodeOutOfService, longhorn.DataOnlyThere, "w1", nil,
			"the fence of w1 stopped it (its only copy of some volume is on w1): rejoin w1 with kip node add 192.0.2.51, or see kip service start db --project shop --environment prod"},
		{cluster.NodeOutOfService, longhorn.DataCurrent, "", []string{"srv"}, "w1 is fenced (current copies of its data are on srv)"},
	} {
		s.FenceStop = tt.fenceStop
		if got := strandedWhy("w1", "192.0.2.51", tt.st, s, tt.data, tt.on); got != tt.want {
			t.Errorf("strandedWhy(%s, %s) =\n%q, want\n%q", tt.st, tt.data, got, tt.want)
		}
	}
	// A worker kip keeps no record of: its host is unknown.
	s.FenceStop = "w1"
	if got, want := strandedWhy("w1", "", cluster.NodeOutOfService, s, longhorn.DataOnlyThere, nil), "rejoin w1 with kip node add HOST,"; !strings.Contains(got, want) {
		t.Errorf("strandedWhy for a worker kip keeps no record of = %q, want it to say %q", got, want)
	}
}
