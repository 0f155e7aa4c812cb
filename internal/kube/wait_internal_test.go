package kube

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestDeploymentRollout(t *testing.T) {
	dep := func(gen, observed int64, replicas int32, st appsv1.DeploymentStatus) *appsv1.Deployment {
		st.ObservedGeneration = observed
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kipper-system", Name: "console-api", Generation: gen},
			Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(replicas)},
			Status:     st,
		}
	}
	tests := []struct {
		name        string
		d           *appsv1.Deployment
		done        bool
		pending     string
		errContains string
	}{
		{"not observed", dep(3, 2, 2, appsv1.DeploymentStatus{}), false,
			"Deployment kipper-system/console-api: spec update not yet observed (generation 3, observed 2)", ""},
		{"updating", dep(2, 2, 2, appsv1.DeploymentStatus{Replicas: 2, UpdatedReplicas: 1}), false,
			"Deployment kipper-system/console-api has 1 of 2 replicas updated, 0 available", ""},
		{"old replicas left", dep(2, 2, 2, appsv1.DeploymentStatus{Replicas: 3, UpdatedReplicas: 2, AvailableReplicas: 2}), false,
			"Deployment kipper-system/console-api has 2 of 2 replicas updated, 2 available, 1 old replica pending termination", ""},
		{"not available", dep(2, 2, 1, appsv1.DeploymentStatus{Replicas: 1, UpdatedReplicas: 1}), false,
			"Deployment kipper-system/console-api has 1 of 1 replica updated, 0 available", ""},
		{"done", dep(2, 2, 2, appsv1.DeploymentStatus{Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: 2}), true, "", ""},
		{"scaled to zero", dep(2, 2, 0, appsv1.DeploymentStatus{}), true, "", ""},
		{"deadline exceeded", dep(2, 2, 2, appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{{
			Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded",
			Message: `ReplicaSet "console-api-5d9" has timed out progressing.`}}}), false, "",
			`Deployment kipper-system/console-api exceeded its progress deadline: ReplicaSet "console-api-5d9" has timed out progressing.`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done, pending, err := deploymentRollout(tt.d)
			if tt.errContains != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errContains) {
					t.Fatalf("err = %v, want %q", err, tt.errContains)
				}
				return
			}
			if err != nil || done != tt.done || pending != tt.pending {
				t.Errorf("got %v %q %v, want %v %q", done, pending, err, tt.done, tt.pending)
			}
		})
	}
}

func TestDaemonSetRollout(t *testing.T) {
	ds := func(strategy appsv1.DaemonSetUpdateStrategyType, st appsv1.DaemonSetStatus) *appsv1.DaemonSet {
		st.ObservedGeneration = 1
		return &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: "longhorn-manager", Generation: 1},
			Spec:       appsv1.DaemonSetSpec{UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: strategy}},
			Status:     st,
		}
	}
	done, pending, err := daemonSetRollout(ds(appsv1.RollingUpdateDaemonSetStrategyType, appsv1.DaemonSetStatus{DesiredNumberScheduled: 3, UpdatedNumberScheduled: 2, NumberAvailable: 2}))
	if done || err != nil || pending != "DaemonSet longhorn-system/longhorn-manager has 2 of 3 pods updated, 2 available" {
		t.Errorf("updating: %v %q %v", done, pending, err)
	}
	done, _, err = daemonSetRollout(ds(appsv1.RollingUpdateDaemonSetStrategyType, appsv1.DaemonSetStatus{DesiredNumberScheduled: 3, UpdatedNumberScheduled: 3, NumberAvailable: 3}))
	if !done || err != nil {
		t.Errorf("rolled out: %v %v", done, err)
	}
	_, _, err = daemonSetRollout(ds(appsv1.OnDeleteDaemonSetStrategyType, appsv1.DaemonSetStatus{}))
	if err == nil || err.Error() != "DaemonSet longhorn-system/longhorn-manager has update strategy OnDelete: only a RollingUpdate rollout can be waited for" {
		t.Errorf("OnDelete: %v", err)
	}
}

func TestStatefulSetRollout(t *testing.T) {
	sts := func(partition *int32, st appsv1.StatefulSetStatus) *appsv1.StatefulSet {
		st.ObservedGeneration = 1
		s := &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "db", Generation: 1},
			Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3), UpdateStrategy: appsv1.StatefulSetUpdateStrategy{
				Type: appsv1.RollingUpdateStatefulSetStrategyType,
			}},
			Status: st,
		}
		if partition != nil {
			s.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{Partition: partition}
		}
		return s
	}
	for _, tt := range []struct {
		name    string
		s       *appsv1.StatefulSet
		done    bool
		pending string
	}{
		{"not ready", sts(nil, appsv1.StatefulSetStatus{ReadyReplicas: 2, UpdatedReplicas: 1}), false, "StatefulSet apps/db has 2 of 3 replicas ready, 1 updated"},
		{"revision", sts(nil, appsv1.StatefulSetStatus{ReadyReplicas: 3, UpdatedReplicas: 2, CurrentRevision: "db-1", UpdateRevision: "db-2"}), false, "StatefulSet apps/db has 2 of 3 replicas updated to revision db-2"},
		{"done", sts(nil, appsv1.StatefulSetStatus{ReadyReplicas: 3, UpdatedReplicas: 3, CurrentRevision: "db-2", UpdateRevision: "db-2"}), true, ""},
		{"partition pending", sts(ptr.To[int32](1), appsv1.StatefulSetStatus{ReadyReplicas: 3, UpdatedReplicas: 1, CurrentRevision: "db-1", UpdateRevision: "db-2"}), false, "StatefulSet apps/db has 1 of 2 replicas updated (partition 1)"},
		{"partition done", sts(ptr.To[int32](1), appsv1.StatefulSetStatus{ReadyReplicas: 3, UpdatedReplicas: 2, CurrentRevision: "db-1", UpdateRevision: "db-2"}), true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			done, pending, err := statefulSetRollout(tt.s)
			if err != nil || done != tt.done || pending != tt.pending {
				t.Errorf("got %v %q %v, want %v %q", done, pending, err, tt.done, tt.pending)
			}
		})
	}
}

func TestNodeNotReady(t *testing.T) {
	node := func(conds ...corev1.NodeCondition) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w1"}, Status: corev1.NodeStatus{Conditions: conds}}
	}
	for _, tt := range []struct {
		n    *corev1.Node
		want string
	}{
		{node(corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}), ""},
		{node(corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "container runtime is down"}),
			"node w1 not Ready (KubeletNotReady: container runtime is down)"},
		{node(corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown"}),
			"node w1 Ready unknown (NodeStatusUnknown)"},
		{node(), "node w1 has not reported Ready yet"},
	} {
		if got := nodeNotReady(tt.n); got != tt.want {
			t.Errorf("nodeNotReady = %q, want %q", got, tt.want)
		}
	}
}

func TestPollNamesPendingAndHonoursContext(t *testing.T) {
	pending := func(context.Context) (bool, string, error) { return false, "thing x has 0 of 1 ready", nil }
	err := Poll(context.Background(), 300*time.Millisecond, "things", pending)
	if err == nil || err.Error() != "timed out after 300ms waiting for things: thing x has 0 of 1 ready" {
		t.Errorf("timeout: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	began := time.Now()
	err = Poll(ctx, time.Hour, "things", pending)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "thing x has 0 of 1 ready") {
		t.Errorf("cancel: %v", err)
	}
	if time.Since(began) > 5*time.Second {
		t.Errorf("cancel took %s", time.Since(began))
	}

	boom := errors.New("forbidden")
	err = Poll(context.Background(), time.Hour, "things", func(context.Context) (bool, string, error) { return false, "", boom })
	if !errors.Is(err, boom) || err.Error() != "wait for things: forbidden" {
		t.Errorf("fatal: %v", err)
	}

	calls := 0
	err = Poll(context.Background(), time.Minute, "things", func(context.Context) (bool, string, error) {
		calls++
		return calls == 3, "not yet", nil
	})
	if err != nil || calls != 3 {
		t.Errorf("eventually done: %v after %d calls", err, calls)
	}
}
