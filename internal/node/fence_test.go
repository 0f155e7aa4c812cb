package node

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCheckNotReady lets a fence go ahead only for a worker NotReady (or Unknown) for at least a
// minute, or one that never reported Ready.
func TestCheckNotReady(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	node := func(status corev1.ConditionStatus, ago time.Duration) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w1"}}
		if status != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(now.Add(-ago))}}
		}
		return n
	}
	for _, tt := range []struct {
		name string
		n    *corev1.Node
		want string // "" for none
	}{
		{"Ready", node(corev1.ConditionTrue, time.Hour), "worker w1 is Ready, and a fence is for a worker that stopped reporting: to take it out of service, run kip node reboot w1 or kip node remove w1"},
		{"NotReady for 59 s", node(corev1.ConditionFalse, 59*time.Second), "worker w1 has been NotReady for 59s only, and a fence needs it not reporting for at least 1m0s"},
		{"Unknown for 10 s", node(corev1.ConditionUnknown, 10*time.Second), "worker w1 has been Unknown for 10s only"},
		{"NotReady for a minute", node(corev1.ConditionFalse, time.Minute), ""},
		{"Unknown for an hour", node(corev1.ConditionUnknown, time.Hour), ""},
		{"never reported", node("", 0), ""},
	} {
		err := checkNotReady(tt.n, now)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want none", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}
