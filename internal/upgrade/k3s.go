package upgrade

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/node"
	"kipper.run/kip/internal/workflow"
)

// k3sMove is what kip upgrade --k3s does with the nodes' k3s, decided from the API alone (so
// --check needs no SSH key): the server from its release to the pin, then the ready workers.
type k3sMove struct {
	// server is the server's node; from the release it reports, to the pin and sha its SHA-256.
	server        string
	from, to, sha string
	nodes         cluster.Nodes
	workers       node.WorkerPlan
	// refused says why k3s cannot move; nil when it can.
	refused error
}

// credentialsTimeout bounds the wait, after the server's restart, for the API to accept kip's
// credentials again: an API server that authenticates operators through Dex can refuse their
// tokens for a few seconds while it initialises authentication.
const credentialsTimeout = 2 * time.Minute

// planK3s reads the nodes and their record and decides the move to the k3s this kip pins, kept
// as u.k3s; it returns why k3s cannot move, nil when it can.
func (u *upgrader) planK3s(ctx context.Context) (refused error, err error) {
	pin, err := u.pinned.Component("k3s")
	if err != nil {
		return nil, err
	}
	list, err := u.cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the nodes: %w", err)
	}
	nodes, err := cluster.ReadNodes(ctx, u.cl.Dynamic)
	if err != nil {
		return nil, err
	}
	u.k3s = planK3s(nodes, list.Items, pin.Version, pin.SHA256)
	return u.k3s.refused, nil
}

// k3sRefused is the upgrade's error when k3s cannot move (why).
func k3sRefused(why error) error {
	return fmt.Errorf("k3s cannot move: %w. Nothing was changed", why)
}

// planK3s decides the move of spec 002's "k3s upgrades": it refuses when the server is more than
// one Kubernetes minor behind the pin (a control plane moves one minor at a time), when any node
// runs a newer release than the pin (k3s is never downgraded), while a worker is still joining,
// and when the move would take a worker beyond the kubelet skew limit (node.PlanWorkerUpgrades).
func planK3s(nodes cluster.Nodes, list []corev1.Node, pin, sha string) k3sMove {
	m := k3sMove{to: pin, sha: sha, nodes: nodes}
	refuse := func(format string, args ...any) k3sMove {
		m.refused = fmt.Errorf(format, args...)
		return m
	}
	i := slices.IndexFunc(list, func(n corev1.Node) bool { return cluster.NodeRole(&n) == cluster.RoleServer })
	if i < 0 {
		return refuse("the cluster has no server node (no node is labelled node-role.kubernetes.io/control-plane), so kip cannot tell which node to move first")
	}
	m.server, m.from = list[i].Name, list[i].Status.NodeInfo.KubeletVersion
	if m.from == "" {
		return refuse("the server's node %s reports no k3s release", m.server)
	}
	for _, n := range list {
		v := n.Status.NodeInfo.KubeletVersion
		if v == "" {
			continue
		}
		newer, err := k3s.Compare(v, pin)
		if err != nil {
			return refuse("node %s: %v", n.Name, err)
		}
		if newer > 0 {
			return refuse("node %s runs k3s %s, newer than %s, which this kip pins, and kip never downgrades k3s: use a kip release that pins at least %s", n.Name, v, pin, v)
		}
	}
	behind, err := k3s.MinorsBehind(m.from, pin)
	if err != nil {
		return refuse("the server's node %s: %v", m.server, err)
	}
	if behind > 1 {
		return refuse("k3s %s on the server is %d Kubernetes minors behind %s, which this kip pins, and Kubernetes upgrades a control plane one minor at a time: "+
			"move it through each minor in between first (kip upgrade --k3s with a kip release that pins it), then run this again", m.from, behind, pin)
	}
	for _, name := range slices.Sorted(maps.Keys(nodes.Workers)) {
		if w := nodes.Workers[name]; w.State == cluster.WorkerJoining {
			return refuse("worker %s is still joining: let kip node add %s finish (run it again), or take the worker out with kip node remove %s, then run this again", name, w.Host, name)
		}
	}
	if m.workers, err = node.PlanWorkerUpgrades(nodes, list, m.from, pin); err != nil {
		return refuse("%v", err)
	}
	return m
}

// write reports the move on the check's report.
func (m k3sMove) write(w io.Writer) {
	if m.refused != nil {
		fmt.Fprintf(w, "  ✗   k3s: %v\n", m.refused)
		return
	}
	if m.from == m.to {
		fmt.Fprintf(w, "  ✔   k3s: the server runs %s, as this kip pins\n", m.to)
	} else {
		fmt.Fprintf(w, "  ·   k3s: the server moves from %s to %s first; restarting k3s pauses the API, usually for under a minute, while pods keep serving\n", m.from, m.to)
	}
	if len(m.workers.Upgrade) > 0 {
		fmt.Fprintf(w, "  ·   k3s: then %s to %s, one at a time, without a drain (a worker already Ready on it is left running)\n",
			cli.Plural(len(m.workers.Upgrade), "worker ", "workers ")+strings.Join(m.workers.Upgrade, ", "), m.to)
	}
	for _, name := range slices.Sorted(maps.Keys(m.workers.Leave)) {
		fmt.Fprintf(w, "  ·   k3s: worker %s is left as it is (%s)\n", name, m.workers.Leave[name])
	}
}

// k3sSteps move the server, wait for the API to accept kip's credentials, then move each
// planned worker: steps the workflow skips once done, so that a re-run goes on from where the
// last one stopped.
func (u *upgrader) k3sSteps() []workflow.Step {
	m := u.k3s
	host := u.o.Server
	if host == "" {
		host = u.rec.Server
	}
	o := node.UpgradeOptions{Kube: u.cl, Dial: u.o.Dial, Version: m.to, Pinned: m.sha, AirgapBundle: u.o.AirgapBundle,
		Nodes: m.nodes, Again: "kip upgrade --k3s"}
	steps := []workflow.Step{node.ServerUpgradeStep(o, m.server, host), u.credentialsStep()}
	return append(steps, node.UpgradeSteps(o, m.workers)...)
}

// credentialsStep waits, before the CRDs and the console, for the API to accept kip's
// credentials again after the server's restart.
func (u *upgrader) credentialsStep() workflow.Step {
	accepted := func(ctx context.Context) (bool, string, error) {
		_, err := u.cl.Kube.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}
	return workflow.Step{
		Name: "k3s-credentials", Title: "Wait for the API to accept kip's credentials",
		Done: "The API accepts kip's credentials", Already: "The API accepts kip's credentials",
		Check: func(ctx context.Context) (bool, error) {
			ok, _, err := accepted(ctx)
			return ok, err
		},
		Apply: func(ctx context.Context) error {
			return kube.Poll(ctx, credentialsTimeout, "the API to accept kip's credentials", accepted)
		},
	}
}
