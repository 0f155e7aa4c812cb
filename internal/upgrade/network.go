package upgrade

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
)

// networkTimeout bounds each wait of the pod network's move: for the network, then for the
// workloads that were ready before (spec 002: five minutes each).
const networkTimeout = 5 * time.Minute

// The backend flannel reports on each Node it runs on (annotation backendTypeAnnotation):
// flannel's own backend names, which k3s's wireguard-native and vxlan settings select.
const (
	backendTypeAnnotation = "flannel.alpha.coreos.com/backend-type"
	flannelWireGuard      = "wireguard"
	flannelVXLAN          = "vxlan"
)

// moveNetwork decides whether this upgrade's change of the server's configuration moves the pod
// network from VXLAN to WireGuard (spec 002), which kip node add needs. An upgrade that decided
// it and was interrupted on the way (st: the new config.yaml written, or a change pending) goes
// on with it, even with --skip-system; otherwise a full upgrade of a cluster on VXLAN moves it
// when the server can load the wireguard module and the operator agrees (--yes agrees). A server
// that cannot load it keeps VXLAN with a warning, and the rest of the upgrade runs.
func (u *upgrader) moveNetwork(ctx context.Context, c *sshx.Client, config []byte, st k3s.ConfigState, intent *upgradeIntent) (bool, error) {
	if u.rec.Network != cluster.NetworkVXLAN {
		return false, nil
	}
	backend, err := k3s.FlannelBackend(config)
	if err != nil {
		return false, err
	}
	if intent.Network == k3s.FlannelWireGuard && (st.Pending || backend == k3s.FlannelWireGuard) {
		u.p.Info("Resuming the pod network's move to WireGuard that an earlier kip upgrade started")
		return true, nil
	}
	intent.Network = ""
	if u.o.SkipSystem {
		return false, nil
	}
	f, err := c.Facts(ctx)
	if err != nil {
		return false, err
	}
	if !f.Modules["wireguard"].Usable() {
		u.p.Warn("The server's kernel cannot load the wireguard module, so the pod network stays on VXLAN, and no worker can join until it moves: " +
			host.WireGuardFix + ", then run kip upgrade again. The rest of the upgrade runs")
		return false, nil
	}
	ok, err := u.o.Prompter.Confirm("The pod network runs VXLAN, and kip node add needs WireGuard. Move it now (once)? k3s restarts on the new backend " +
		"(the API pauses, usually 10 to 30 seconds; running containers are left alone), kip waits up to five minutes each for the network and for the workloads " +
		"that were ready, and restores the previous configuration if either does not come back")
	if err != nil {
		return false, err
	}
	if !ok {
		u.p.Info("The pod network stays on VXLAN; the next kip upgrade offers the move again")
		return false, nil
	}
	intent.Network = k3s.FlannelWireGuard
	return true, nil
}

// waitNetwork waits until node reports flannel running on backend, Ready.
func waitNetwork(ctx context.Context, cl *kube.Clients, node, backend string) error {
	return kube.Poll(ctx, networkTimeout, "the pod network on "+backend, func(ctx context.Context) (bool, string, error) {
		n, err := cl.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil // the API may still be settling after the restart
		}
		have, st := n.Annotations[backendTypeAnnotation], cluster.NodeStatus(n)
		return have == backend && st == cluster.NodeReady, fmt.Sprintf("node %s is %s, flannel on %q", node, st, have), nil
	})
}

// workload is a Deployment, StatefulSet or DaemonSet, by kind, namespace and name.
type workload string

// workloads reads the cluster's Deployments, StatefulSets and DaemonSets: those whose pods are
// all ready, and those whose are not.
func workloads(ctx context.Context, cl *kube.Clients) (ready, notReady []workload, err error) {
	add := func(kind, ns, name string, want, have int32) {
		w := workload(kind + " " + ns + "/" + name)
		if want > 0 && have >= want {
			ready = append(ready, w)
		} else {
			notReady = append(notReady, w)
		}
	}
	apps := cl.Kube.AppsV1()
	ds, err := apps.Deployments(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list Deployments: %w", err)
	}
	for _, d := range ds.Items {
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		add("Deployment", d.Namespace, d.Name, want, d.Status.ReadyReplicas)
	}
	ss, err := apps.StatefulSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list StatefulSets: %w", err)
	}
	for _, s := range ss.Items {
		want := int32(1)
		if s.Spec.Replicas != nil {
			want = *s.Spec.Replicas
		}
		add("StatefulSet", s.Namespace, s.Name, want, s.Status.ReadyReplicas)
	}
	dss, err := apps.DaemonSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list DaemonSets: %w", err)
	}
	for _, d := range dss.Items {
		add("DaemonSet", d.Namespace, d.Name, d.Status.DesiredNumberScheduled, d.Status.NumberReady)
	}
	return ready, notReady, nil
}

// waitWorkloads waits until each workload that was ready (before) is ready again; one that is
// gone no longer counts.
func waitWorkloads(ctx context.Context, cl *kube.Clients, before []workload) error {
	return kube.Poll(ctx, networkTimeout, "the workloads that were ready to be ready again", func(ctx context.Context) (bool, string, error) {
		_, notReady, err := workloads(ctx, cl)
		if err != nil {
			return false, err.Error(), nil
		}
		var pending []string
		for _, w := range notReady {
			if slices.Contains(before, w) {
				pending = append(pending, string(w))
			}
		}
		return len(pending) == 0, "not ready: " + strings.Join(pending, ", "), nil
	})
}
