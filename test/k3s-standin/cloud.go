package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// uninitializedTaint is the taint a kubelet with --cloud-provider=external registers its Node
// with, until a cloud controller has set the Node's addresses.
const uninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"

// runCloudController does what k3s's embedded cloud controller and its CoreDNS NodeHosts
// controller do, on the server, until ctx ends: it gives each new Node the addresses its k3s
// annotations name (internal, external, host name) and lifts the uninitialized taint, and keeps
// CoreDNS's NodeHosts listing every Node.
func runCloudController(ctx context.Context, admin kubernetes.Interface) {
	written := "" // the NodeHosts last found or written: unchanged Nodes cost no ConfigMap request
	for {
		nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			for i := range nodes.Items {
				if err := initializeNode(ctx, admin, &nodes.Items[i]); err != nil && ctx.Err() == nil {
					slog.Warn("cloud controller: initialize node", "node", nodes.Items[i].Name, "err", err)
				}
			}
			if want := nodeHosts(nodes.Items); want != written {
				if err := updateNodeHosts(ctx, admin, want); err != nil && ctx.Err() == nil && !errors.Is(err, errNoCoreDNS) {
					slog.Warn("cloud controller: update CoreDNS NodeHosts", "err", err)
				} else if err == nil {
					written = want
				}
			}
		} else if ctx.Err() == nil {
			slog.Warn("cloud controller: list nodes", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// initializeNode sets a Node's addresses from its k3s annotations and lifts the uninitialized
// taint; on an initialized Node it brings the addresses up to date when the annotations changed
// (a node restarted with another node-ip), as the cloud node controller's address sync does.
func initializeNode(ctx context.Context, admin kubernetes.Interface, nd *corev1.Node) error {
	uninitialized := slices.ContainsFunc(nd.Spec.Taints, func(t corev1.Taint) bool { return t.Key == uninitializedTaint })
	internal := nd.Annotations["k3s.io/internal-ip"]
	if internal == "" {
		return nil // the node's stand-in has not annotated it yet
	}
	var addrs []corev1.NodeAddress
	for _, ip := range strings.Split(internal, ",") {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	if ext := nd.Annotations["k3s.io/external-ip"]; ext != "" {
		for _, ip := range strings.Split(ext, ",") {
			addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip})
		}
	}
	if h := nd.Annotations["k3s.io/hostname"]; h != "" {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: h})
	}
	if !uninitialized && slices.Equal(addrs, nd.Status.Addresses) {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := admin.CoreV1().Nodes().Get(ctx, nd.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Addresses = addrs
		if cur, err = admin.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return err
		}
		if !uninitialized {
			slog.Info("cloud controller: updated the node's addresses", "node", nd.Name)
			return nil
		}
		cur.Spec.Taints = slices.DeleteFunc(cur.Spec.Taints, func(t corev1.Taint) bool { return t.Key == uninitializedTaint })
		_, err = admin.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			slog.Info("cloud controller: initialized node", "node", nd.Name)
		}
		return err
	})
}

// errNoCoreDNS: the coredns ConfigMap does not exist (disabled); not worth a warning.
var errNoCoreDNS = errors.New("no coredns ConfigMap")

// nodeHosts is CoreDNS's NodeHosts: each Node's internal address and name, one per line.
func nodeHosts(nodes []corev1.Node) string {
	var lines []string
	for i := range nodes {
		if ip := internalIP(&nodes[i]); ip != "" {
			lines = append(lines, ip+" "+nodes[i].Name)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n"
}

// updateNodeHosts sets CoreDNS's NodeHosts to want. Without the ConfigMap (CoreDNS disabled) it
// does nothing and says so with an error, so that it is tried again.
func updateNodeHosts(ctx context.Context, admin kubernetes.Interface, want string) error {
	cms := admin.CoreV1().ConfigMaps("kube-system")
	cm, err := cms.Get(ctx, "coredns", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return errNoCoreDNS
	}
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if cm.Data["NodeHosts"] == want {
		return nil
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data["NodeHosts"] = want
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	return nil
}
