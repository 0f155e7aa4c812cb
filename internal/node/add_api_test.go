package node

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/test/testenv"
)

// TestJoinRefusesOtherNodes runs a join's check of the cluster's nodes against the real API
// server (kwok's Nodes): it refuses, before it reaches any worker, a fenced worker, naming the
// command that rejoins it at the host kip recorded, and a worker kip did not record.
func TestJoinRefusesOtherNodes(t *testing.T) {
	env, cl := apiCluster(t, "ja-srv")
	ctx := context.Background()
	env.AddNode(t, "ja-stray", testenv.NodeOptions{})
	env.AddNode(t, "ja-fenced", fencedNode)
	nodes := recordWorkers(t, cl, map[string]cluster.Worker{"ja-fenced": {Host: "203.0.113.41", State: cluster.WorkerReady, Fence: &cluster.FenceRecord{}}})
	// o.Dial is nil: both refusals come before the join reaches any worker.
	j := &joiner{o: &AddOptions{Host: "203.0.113.50"}, cl: cl, nodes: nodes, intent: joinIntent{Node: "ja-new"}}
	err := j.checkNodes(ctx)
	if want := "node ja-fenced is fenced (out of service): a join updates every node, and kip cannot reach a fenced node; rejoin it with kip node add 203.0.113.41 first, or, when its host is gone for good, give it up with kip node remove ja-fenced --force"; err == nil || err.Error() != want {
		t.Errorf("join with ja-fenced fenced: %v\nwant %s", err, want)
	}

	// The node lifecycle controller writes Nodes too: the change is made on the latest one, again
	// on a conflict.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cl.Kube.CoreV1().Nodes().Get(ctx, "ja-fenced", metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = nil
		_, err = cl.Kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Untainted, ja-fenced is still fenced by kip's record, the fence's truth.
	if err := j.checkNodes(ctx); err == nil || !strings.Contains(err.Error(), "node ja-fenced is fenced") {
		t.Errorf("join with ja-fenced untainted but its fence recorded: %v", err)
	}
	w := j.nodes.Workers["ja-fenced"]
	w.Fence = nil
	j.nodes.Workers["ja-fenced"] = w
	err = j.checkNodes(ctx)
	if want := "node ja-stray is a worker kip did not record: run kip node add <host> for that worker first to adopt it, then add 203.0.113.50"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("join with ja-stray in the cluster: %v\nwant %s", err, want)
	}
}
