package upgrade

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
)

// TestPlanK3s decides kip upgrade --k3s from the releases the nodes report and the nodes'
// record: each refusal of spec 002's "k3s upgrades", and the plan and report of a move.
func TestPlanK3s(t *testing.T) {
	const pin = "v1.37.2+k3s1"
	node := func(name, release string, server bool) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if server {
			n.Labels["node-role.kubernetes.io/control-plane"] = "true"
		}
		n.Status.NodeInfo.KubeletVersion = release
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		return n
	}
	record := func(states map[string]string) cluster.Nodes {
		n := cluster.Nodes{Workers: map[string]cluster.Worker{}}
		for name, st := range states {
			n.Workers[name] = cluster.Worker{Host: "203.0.113.7", State: st}
		}
		return n
	}
	for _, tc := range []struct {
		name    string
		nodes   cluster.Nodes
		list    []corev1.Node
		refused string
		upgrade []string
		report  []string
	}{
		{name: "the server one minor behind, then the ready workers in name order",
			nodes:   record(map[string]string{"w2": cluster.WorkerReady, "w1": cluster.WorkerReady, "w3": cluster.WorkerRemoving}),
			list:    []corev1.Node{node("srv", "v1.36.3+k3s1", true), node("w2", "v1.36.3+k3s1", false), node("w1", "v1.35.4+k3s1", false), node("w3", "v1.36.3+k3s1", false)},
			upgrade: []string{"w1", "w2"},
			report: []string{"k3s: the server moves from v1.36.3+k3s1 to v1.37.2+k3s1 first",
				"k3s: then workers w1, w2 to v1.37.2+k3s1, one at a time, without a drain",
				"k3s: worker w3 is left as it is (recorded as removing)"}},
		{name: "a server already on the pin",
			nodes: record(nil), list: []corev1.Node{node("srv", pin, true)},
			report: []string{"✔   k3s: the server runs v1.37.2+k3s1, as this kip pins"}},
		{name: "the server two minors behind",
			nodes: record(nil), list: []corev1.Node{node("srv", "v1.35.4+k3s1", true)},
			refused: "k3s v1.35.4+k3s1 on the server is 2 Kubernetes minors behind v1.37.2+k3s1, which this kip pins, and Kubernetes upgrades a control plane one minor at a time"},
		{name: "the server newer than the pin",
			nodes: record(nil), list: []corev1.Node{node("srv", "v1.37.3+k3s1", true)},
			refused: "node srv runs k3s v1.37.3+k3s1, newer than v1.37.2+k3s1, which this kip pins, and kip never downgrades k3s: use a kip release that pins at least v1.37.3+k3s1"},
		{name: "a fenced or removing worker newer than the pin still stops it",
			nodes: record(map[string]string{"w1": cluster.WorkerRemoving}), list: []corev1.Node{node("srv", "v1.36.3+k3s1", true), node("w1", "v1.37.2+k3s2", false)},
			refused: "node w1 runs k3s v1.37.2+k3s2, newer than v1.37.2+k3s1"},
		{name: "a worker still joining",
			nodes: record(map[string]string{"w1": cluster.WorkerJoining}), list: []corev1.Node{node("srv", "v1.36.3+k3s1", true)},
			refused: "worker w1 is still joining: let kip node add 203.0.113.7 finish (run it again), or take the worker out with kip node remove w1, then run this again"},
		{name: "the move would leave a worker four minors behind",
			nodes: record(map[string]string{"w1": cluster.WorkerReady}), list: []corev1.Node{node("srv", "v1.36.3+k3s1", true), node("w1", "v1.33.9+k3s1", false)},
			refused: "worker w1 runs k3s v1.33.9+k3s1: moving the server to v1.37.2+k3s1 would leave it 4 Kubernetes minors behind"},
		{name: "no server node",
			nodes: record(nil), list: []corev1.Node{node("w1", pin, false)},
			refused: "the cluster has no server node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := planK3s(tc.nodes, tc.list, pin, "")
			var out bytes.Buffer
			m.write(&out)
			if tc.refused != "" {
				if m.refused == nil || !strings.Contains(m.refused.Error(), tc.refused) {
					t.Fatalf("refusal %v, want it to say %q", m.refused, tc.refused)
				}
				if !strings.Contains(out.String(), "✗   k3s: "+m.refused.Error()) {
					t.Errorf("report:\n%s", out.String())
				}
				if err := (findings{k3s: m.refused}).blocked(); err == nil || !strings.Contains(err.Error(), "k3s cannot move") {
					t.Errorf("the check's verdict: %v", err)
				}
				return
			}
			if m.refused != nil {
				t.Fatalf("refused: %v", m.refused)
			}
			if !slices.Equal(m.workers.Upgrade, tc.upgrade) || m.server != "srv" || m.to != pin {
				t.Errorf("plan: server %s to %s, workers %v; want srv to %s, workers %v", m.server, m.to, m.workers.Upgrade, pin, tc.upgrade)
			}
			for _, line := range tc.report {
				if !strings.Contains(out.String(), line) {
					t.Errorf("report lacks %q:\n%s", line, out.String())
				}
			}
		})
	}
}

// TestValidateK3sFlags refuses --airgap-bundle without --k3s, and a bundle that is not a
// directory, before anything connects.
func TestValidateK3sFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "k3s")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{AirgapBundle: t.TempDir()}, "--airgap-bundle gives k3s's binary to --k3s: pass --k3s too"},
		{Options{K3s: true, AirgapBundle: file}, "--airgap-bundle " + file + ": not a directory"},
		{Options{K3s: true, AirgapBundle: t.TempDir()}, ""},
	} {
		err := tc.o.validate()
		var usage *cli.UsageError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.want != "" && (!errors.As(err, &usage) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want a usage error saying %q", tc.o, err, tc.want)
		}
	}
}
