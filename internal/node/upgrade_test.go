package node

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
)

// TestPlanWorkerUpgrades decides what a kip install re-run does with each recorded worker from
// the releases their nodes report: the refusals before the server moves, and who is left alone.
func TestPlanWorkerUpgrades(t *testing.T) {
	node := func(name, release string, fenced bool) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		n.Status.NodeInfo.KubeletVersion = release
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		if fenced {
			n.Spec.Taints = []corev1.Taint{{Key: cluster.OutOfServiceTaint, Effect: corev1.TaintEffectNoExecute}}
		}
		return n
	}
	workers := func(states ...string) cluster.Nodes {
		n := cluster.Nodes{Workers: map[string]cluster.Worker{}}
		for i, s := range states {
			n.Workers[string(rune('a'+i))+"-w"] = cluster.Worker{Host: "203.0.113." + string(rune('1'+i)), State: s}
		}
		return n
	}
	for _, tc := range []struct {
		name     string
		nodes    cluster.Nodes
		list     []corev1.Node
		from, to string
		upgrade  []string
		leave    map[string]string
		err      string
	}{
		{name: "ready workers in name order, the one on the release too (its step finds it done)",
			nodes: workers(cluster.WorkerReady, cluster.WorkerReady), list: []corev1.Node{node("b-w", "v1.37.2+k3s1", false), node("a-w", "v1.36.4+k3s1", false)},
			from: "v1.36.4+k3s1", to: "v1.37.2+k3s1", upgrade: []string{"a-w", "b-w"}},
		{name: "joining, removing, fenced and unregistered workers are left alone",
			nodes: workers(cluster.WorkerJoining, cluster.WorkerRemoving, cluster.WorkerReady, cluster.WorkerReady, cluster.WorkerReady),
			list:  []corev1.Node{node("a-w", "v1.36.4+k3s1", false), node("b-w", "v1.36.4+k3s1", false), node("c-w", "v1.36.4+k3s1", true), node("e-w", "v1.36.4+k3s1", false)},
			from:  "v1.36.4+k3s1", to: "v1.37.2+k3s1", upgrade: []string{"e-w"},
			leave: map[string]string{"a-w": "recorded as joining", "b-w": "recorded as removing", "c-w": "fenced", "d-w": "no node of that name in the cluster"}},
		{name: "a worker newer than the server will run",
			nodes: workers(cluster.WorkerReady), list: []corev1.Node{node("a-w", "v1.37.3+k3s1", false)}, from: "v1.37.2+k3s1", to: "v1.37.2+k3s1",
			err: "worker a-w runs k3s v1.37.3+k3s1, newer than v1.37.2+k3s1, which the server will run, and k3s is never downgraded: use a kip release that installs at least v1.37.3+k3s1"},
		{name: "a newer k3s revision counts as newer",
			nodes: workers(cluster.WorkerReady), list: []corev1.Node{node("a-w", "v1.37.2+k3s2", false)}, from: "v1.37.2+k3s1", to: "v1.37.2+k3s1", err: "newer than v1.37.2+k3s1"},
		{name: "the move would take a worker beyond three minors behind",
			nodes: workers(cluster.WorkerReady), list: []corev1.Node{node("a-w", "v1.33.9+k3s1", false)}, from: "v1.36.4+k3s1", to: "v1.37.2+k3s1",
			err: "worker a-w runs k3s v1.33.9+k3s1: moving the server to v1.37.2+k3s1 would leave it 4 Kubernetes minors behind, beyond the 3 the version skew policy allows: bring it to the server's v1.36.4+k3s1 first with 'kip node add 203.0.113.1'"},
		{name: "a worker already beyond the limit is brought up by the worker upgrade",
			nodes: workers(cluster.WorkerReady), list: []corev1.Node{node("a-w", "v1.32.1+k3s1", false)}, from: "v1.36.4+k3s1", to: "v1.37.2+k3s1", upgrade: []string{"a-w"}},
		{name: "three minors behind after the move is within the limit",
			nodes: workers(cluster.WorkerReady), list: []corev1.Node{node("a-w", "v1.34.1+k3s1", false)}, from: "v1.36.4+k3s1", to: "v1.37.2+k3s1", upgrade: []string{"a-w"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := PlanWorkerUpgrades(tc.nodes, tc.list, tc.from, tc.to)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(plan.Upgrade, ",") != strings.Join(tc.upgrade, ",") {
				t.Errorf("upgrade %q, want %q", plan.Upgrade, tc.upgrade)
			}
			if len(plan.Leave) != len(tc.leave) {
				t.Errorf("leave %q, want %q", plan.Leave, tc.leave)
			}
			for name, why := range tc.leave {
				if plan.Leave[name] != why {
					t.Errorf("leave %s: %q, want %q", name, plan.Leave[name], why)
				}
			}
		})
	}
}
