package prune

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
)

func TestRemovableOnlyTheVolumesOwnDirectory(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{cluster.LocalStorageDir + "/pvc-1_shop-prod_data-db-0", true},
		{cluster.LocalStorageDir + "/pvc-2_shop-prod_data-db-0", false}, // another volume's
		{cluster.LocalStorageDir, false},
		{cluster.LocalStorageDir + "/", false},
		{cluster.LocalStorageDir + "/pvc-1_x/../../../etc", false},
		{cluster.LocalStorageDir + "/pvc-1_x/inner", false},
		{"/var/lib/other/pvc-1_shop-prod_data-db-0", false},
		{"/", false},
	} {
		err := removable(Kept{Volume: "pvc-1", Path: tc.path})
		if (err == nil) != tc.ok {
			t.Errorf("removable(%q) = %v, want ok %v", tc.path, err, tc.ok)
		}
	}
}

func TestReadySince(t *testing.T) {
	at := func(m int) metav1.Time { return metav1.NewTime(time.Date(2026, 12, 2, 10, m, 0, 0, time.UTC)) }
	pod := func(ready corev1.ConditionStatus, started metav1.Time, containerReady bool) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: at(0)}},
			ContainerStatuses: []corev1.ContainerStatus{{Ready: containerReady,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}}}}
	}
	if since, ok := ReadySince(pod(corev1.ConditionTrue, at(0), true)); !ok || !since.Equal(at(0).Time) {
		t.Errorf("ready pod: %v %v", since, ok)
	}
	// A container restarted after the pod's Ready condition last changed: the hour starts there.
	if since, ok := ReadySince(pod(corev1.ConditionTrue, at(30), true)); !ok || !since.Equal(at(30).Time) {
		t.Errorf("restarted container: %v %v", since, ok)
	}
	if _, ok := ReadySince(pod(corev1.ConditionFalse, at(0), true)); ok {
		t.Error("a pod whose Ready condition is false counted as Ready")
	}
	if _, ok := ReadySince(pod(corev1.ConditionTrue, at(0), false)); ok {
		t.Error("a pod with a container not ready counted as Ready")
	}
}

func TestWaivers(t *testing.T) {
	c := Kept{Holds: []Hold{{Condition: CondReady}, {Condition: CondBackup}}}
	for _, tc := range []struct {
		w    Waivers
		want bool
	}{{Waivers{}, false}, {Waivers{Now: true}, false}, {Waivers{Unproven: true}, false}, {Waivers{Now: true, Unproven: true}, true}} {
		if got := c.Deletable(tc.w); got != tc.want {
			t.Errorf("Deletable(%+v) = %v, want %v", tc.w, got, tc.want)
		}
	}
	for _, cond := range []string{CondMoved, CondReplaced, CondCopies} {
		if (&Kept{Holds: []Hold{{Condition: cond}}}).Deletable(Waivers{Now: true, Unproven: true}) {
			t.Errorf("%s was waived", cond)
		}
	}
}
