package node

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// asHelper, set by fence_everywrite_api_test.go (built with -tags kipfault), runs the binary as
// the helper process that fences a worker when its environment asks for that, and never returns
// then.
var asHelper = func() {}

// TestMain shares one API test environment among this package's tests; run as the helper, the
// binary runs one fence.
func TestMain(m *testing.M) {
	asHelper()
	os.Exit(testenv.Main(m))
}

// TestList lists a cluster's nodes from the real API server (kwok's Nodes): the server, a
// recorded worker on the private network (cordoned), a fenced worker, a worker kip did not join,
// and a recorded worker whose Node is gone; first before any worker is recorded, then with the
// record, as text and as JSON.
func TestList(t *testing.T) {
	env, cl := apiCluster(t, "srv")
	ctx := context.Background()
	env.AddNode(t, "w1", testenv.NodeOptions{})
	env.AddNode(t, "w2", fencedNode)
	env.AddNode(t, "w3", testenv.NodeOptions{})
	if _, err := cl.Kube.CoreV1().Nodes().Patch(ctx, "w1", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	list := func(jsonOut bool) string {
		t.Helper()
		var out bytes.Buffer
		if err := List(ctx, &ListOptions{Kube: func() (*kube.Clients, error) { return cl, nil }, JSON: jsonOut, Out: &out}); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}

	// Not installed by kip: refused, naming install.
	var out bytes.Buffer
	if err := List(ctx, &ListOptions{Kube: func() (*kube.Clients, error) { return cl, nil }, Out: &out}); err == nil || !strings.Contains(err.Error(), "install it with 'kip install --host HOST' first") {
		t.Fatalf("list without a cluster record = %v", err)
	}
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server = "small", cluster.StorageLonghorn, "203.0.113.10"
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// No worker recorded: role, status and address only; every worker is unrecorded.
	text := list(false)
	if strings.Contains(text, "MODE") || !strings.Contains(text, "NAME  ROLE    STATUS") {
		t.Errorf("without recorded workers the list has only role, status and address:\n%s", text)
	}
	for _, want := range []string{"w1    worker  Ready,SchedulingDisabled", "w2    worker  OutOfService", "Worker w3 was not joined by kip"} {
		if !strings.Contains(text, want) {
			t.Errorf("the list lacks %q:\n%s", want, text)
		}
	}
	if !strings.HasPrefix(strings.TrimLeft(text, "\n"), "Nodes\n  NAME") || strings.Index(text, "srv ") > strings.Index(text, "w1 ") {
		t.Errorf("the server is not listed first:\n%s", text)
	}

	private := cluster.Path{Mode: cluster.ModePrivate, Network: netip.MustParsePrefix("10.77.0.0/24"), Server: netip.MustParseAddr("10.77.0.20"), Node: netip.MustParseAddr("10.77.0.21")}
	if _, err := cluster.UpdateNodes(ctx, cl.Dynamic, func(rec *cluster.Nodes) error {
		*rec = cluster.Nodes{Mode: cluster.ModePrivate, Workers: map[string]cluster.Worker{
			"w1": {Host: "203.0.113.21", SSHPort: 22, SSHUser: "root", Path: private, FirewallManaged: true, Copies: cluster.CopiesEligible, State: cluster.WorkerReady, JoinedAt: time.Now()},
			"w2": {Host: "203.0.113.22", SSHPort: 2222, SSHUser: "root", Path: private, Copies: cluster.CopiesRefused, CopiesWhy: "a 4 KiB sync took 38 ms", State: cluster.WorkerReady},
			"w4": {Host: "203.0.113.24", SSHPort: 22, SSHUser: "root", Path: private, State: cluster.WorkerJoining},
		}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	text = list(false)
	for _, want := range []string{
		"NAME  ROLE    STATUS                    ADDRESS     K3S", "MODE     COPIES       SSH",
		"private  eligible     203.0.113.10", // the server
		"10.77.0.21", "eligible     203.0.113.21", "refused      203.0.113.22:2222",
		"w4    worker  Missing,joining", "not checked",
		"Worker w3 was not joined by kip", "Worker w4 is recorded (203.0.113.24) but has no node in the cluster",
		"Worker w2: copies refused: a 4 KiB sync took 38 ms",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the list lacks %q:\n%s", want, text)
		}
	}

	var got []Listed
	if err := json.Unmarshal([]byte(list(true)), &got); err != nil {
		t.Fatal(err)
	}
	byName := map[string]Listed{}
	for _, l := range got {
		byName[l.Name] = l
	}
	if len(got) != 5 || got[0].Name != "srv" || got[0].Role != cluster.RoleServer || !got[0].Recorded || got[0].SSH != "203.0.113.10" || got[0].Mode != cluster.ModePrivate {
		t.Errorf("JSON: the server first: %+v", got)
	}
	if w := byName["w1"]; !w.Recorded || w.Status != cluster.NodeReady || !w.Unschedulable || w.Mode != cluster.ModePrivate || w.Address != "10.77.0.21" || w.Copies != cluster.CopiesEligible {
		t.Errorf("JSON w1: %+v", w)
	}
	if w := byName["w2"]; w.Status != cluster.NodeOutOfService || w.SSH != "203.0.113.22:2222" || w.CopiesWhy == "" {
		t.Errorf("JSON w2: %+v", w)
	}
	if w := byName["w3"]; w.Recorded || w.Mode != "" || w.Status != cluster.NodeReady {
		t.Errorf("JSON w3: %+v", w)
	}
	if w := byName["w4"]; !w.Recorded || w.Status != NodeMissing || w.State != cluster.WorkerJoining || w.Copies != cluster.CopiesUnchecked {
		t.Errorf("JSON w4: %+v", w)
	}
}

// apiCluster connects to the test API server and, unless server is "", adds a kwok Node of that
// name labelled as the cluster's server.
func apiCluster(t *testing.T, server string) (*testenv.Env, *kube.Clients) {
	t.Helper()
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if server != "" {
		env.AddNode(t, server, testenv.NodeOptions{Labels: map[string]string{"node-role.kubernetes.io/control-plane": "true"}})
	}
	return env, cl
}

// fencedNode shapes a Node kip node fence left out of service.
var fencedNode = testenv.NodeOptions{Taints: []corev1.Taint{{Key: cluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}}

// recordWorkers adds workers to kip's nodes record until t ends, and returns the record.
func recordWorkers(t *testing.T, cl *kube.Clients, workers map[string]cluster.Worker) cluster.Nodes {
	t.Helper()
	nodes, err := cluster.UpdateNodes(t.Context(), cl.Dynamic, func(n *cluster.Nodes) error {
		maps.Copy(n.Workers, workers)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := cluster.UpdateNodes(context.Background(), cl.Dynamic, func(n *cluster.Nodes) error {
			for name := range workers {
				delete(n.Workers, name)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	})
	return nodes
}
