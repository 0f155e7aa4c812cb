package testenv

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/test/nodelease"
)

// ReadyNode creates Node name, which neither a kubelet nor kwok keeps, reporting Ready, and renews
// its Lease until the environment stops. So the node lifecycle controller never counts the Node
// NotReady, and never marks the Pods bound to it NotReady either: they keep the status a test
// writes. Its capacity is zero, so the scheduler places no Pod there. Calling ReadyNode again with
// the same name returns the Node, which stays until the environment stops.
func (e *Env) ReadyNode(t testing.TB, name string, labels map[string]string) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.nodesMu.Lock()
	defer e.nodesMu.Unlock()
	if e.readyNodes[name] {
		n, err := e.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("ready node %s: %v", name, err)
		}
		return n
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	n, err := e.Kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		t.Fatalf("ready node %s: a Node of that name exists already, made by something else", name)
	}
	if err != nil {
		t.Fatalf("ready node %s: %v", name, err)
	}
	// Well within the controller's grace for a new Node that never reported (a minute).
	if n, err = e.reportReady(ctx, name); err != nil {
		t.Fatalf("ready node %s: %v", name, err)
	}
	if err := nodelease.Renew(ctx, e.Kube, name); err != nil {
		t.Fatalf("ready node %s: lease: %v", name, err)
	}
	go e.renewLease(name)
	if e.readyNodes == nil {
		e.readyNodes = map[string]bool{}
	}
	e.readyNodes[name] = true
	return n
}

// renewLease renews node's Lease every interval a kubelet does until the environment stops.
func (e *Env) renewLease(node string) {
	tick := time.NewTicker(nodelease.Interval)
	defer tick.Stop()
	for {
		select {
		case <-e.done:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), nodelease.Interval)
		// A renewal that fails is tried again at the next tick, well inside the Lease's duration.
		_ = nodelease.Renew(ctx, e.Kube, node)
		cancel()
	}
}

// reportReady writes Node name's status Ready, as a kubelet posts it, and returns the Node.
func (e *Env) reportReady(ctx context.Context, name string) (*corev1.Node, error) {
	var n *corev1.Node
	// Controllers write the new Node too (its TTL annotation, taints).
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if n, err = e.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "reported Ready by the test environment", LastHeartbeatTime: now, LastTransitionTime: now}}
		n, err = e.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	return n, err
}
