package longhorn

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// Where Longhorn puts copies (spec 001, "Data and availability"): single-copy volumes on the
// server, no copy on a worker that may not hold copies. Longhorn places a volume's replicas on
// nodes whose tags hold every tag of the volume's node selector (its StorageClass's nodeSelector
// parameter, copied onto the Volume), whose node and disk allow scheduling, one per node, the
// disk with the most usable storage first (longhorn-manager scheduler/replica_scheduler.go).
const (
	// ServerTag is the tag of the server's Longhorn node, which the class of one-copy volumes
	// selects.
	ServerTag = "kipper-server"
	// AllowEmptySelector is Longhorn's setting that lets volumes without a node selector schedule
	// onto nodes with tags (its default, true); false would keep every such volume's new copies
	// off the tagged server.
	AllowEmptySelector = "allow-empty-node-selector-volume"
)

// ServerTagged reports whether the server's Longhorn node carries ServerTag; false when Longhorn
// has no node of that name yet.
func ServerTagged(ctx context.Context, cl *kube.Clients, server string) (bool, error) {
	n, err := cl.Longhorn.LonghornV1beta2().Nodes(Namespace).Get(ctx, server, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read Longhorn node %s: %w", server, err)
	}
	return slices.Contains(n.Spec.Tags, ServerTag), nil
}

// TagServer adds ServerTag to the server's Longhorn node, keeping its other tags (one write, on
// the latest node, only when the tag is missing).
func TagServer(ctx context.Context, cl *kube.Clients, server string) error {
	api := cl.Longhorn.LonghornV1beta2().Nodes(Namespace)
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := api.Get(ctx, server, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read Longhorn node %s: %w", server, err)
		}
		if slices.Contains(n.Spec.Tags, ServerTag) {
			return nil
		}
		n.Spec.Tags = append(n.Spec.Tags, ServerTag)
		if _, err := api.Update(ctx, n, metav1.UpdateOptions{FieldManager: kube.FieldManager}); err != nil {
			return fmt.Errorf("tag Longhorn node %s %s: %w", server, ServerTag, err)
		}
		return nil
	})
}

// Pin restricts the new copies of Longhorn volume name to the server (its node selector set to
// ServerTag). Longhorn leaves copies already placed where they are.
func Pin(ctx context.Context, cl *kube.Clients, name string) error {
	patch := fmt.Sprintf(`{"spec":{"nodeSelector":[%q]}}`, ServerTag)
	_, err := cl.Longhorn.LonghornV1beta2().Volumes(Namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager})
	if err != nil {
		return fmt.Errorf("pin Longhorn volume %s to the server: %w", name, err)
	}
	return nil
}

// SchedulingAllowed reports whether Longhorn may place new copies on node (its Longhorn node's
// spec.allowScheduling), and whether that node exists yet.
func SchedulingAllowed(ctx context.Context, cl *kube.Clients, node string) (allowed, found bool, err error) {
	n, err := cl.Longhorn.LonghornV1beta2().Nodes(Namespace).Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("read Longhorn node %s: %w", node, err)
	}
	return n.Spec.AllowScheduling, true, nil
}

// AllowScheduling sets whether Longhorn may place new copies on node. Copies already there stay:
// Longhorn moves them only when asked to evict them.
func AllowScheduling(ctx context.Context, cl *kube.Clients, node string, allow bool) error {
	patch := fmt.Sprintf(`{"spec":{"allowScheduling":%t}}`, allow)
	_, err := cl.Longhorn.LonghornV1beta2().Nodes(Namespace).Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager})
	if err != nil {
		return fmt.Errorf("set Longhorn node %s to %s new copies: %w", node, map[bool]string{true: "take", false: "take no"}[allow], err)
	}
	return nil
}

// Unpinned is a volume of one copy whose new copy Longhorn may place on a worker: it is not
// pinned to the server, so a rebuild (a reboot's, an eviction's) can move it there.
type Unpinned struct {
	Volume    string   `json:"volume"`
	Namespace string   `json:"namespace,omitempty"`
	Claim     string   `json:"claim,omitempty"`
	Nodes     []string `json:"nodes"` // where its copy is now
}

// Sentence says what u is, for kip status.
func (u Unpinned) Sentence() string {
	what := "Longhorn volume " + u.Volume
	if u.Claim != "" {
		what += " (claim " + u.Namespace + "/" + u.Claim + ")"
	}
	where := "no node yet"
	if len(u.Nodes) > 0 {
		where = strings.Join(u.Nodes, ", ")
	}
	return what + " keeps one copy, on " + where + ", and is not pinned to the server: a rebuild can place it on a worker"
}

// UnpinnedVolumes are the volumes among vols that keep one copy and have no node selector (one
// the operator set is theirs to keep, as Longhorn honours it), sorted by name, with the nodes of
// their replicas.
func UnpinnedVolumes(vols []longhornv1beta2.Volume, replicas []longhornv1beta2.Replica) []Unpinned {
	var out []Unpinned
	for i := range vols {
		v := &vols[i]
		if v.Spec.NumberOfReplicas != 1 || len(v.Spec.NodeSelector) > 0 || v.DeletionTimestamp != nil {
			continue
		}
		u := Unpinned{Volume: v.Name, Namespace: v.Status.KubernetesStatus.Namespace, Claim: v.Status.KubernetesStatus.PVCName, Nodes: []string{}}
		for _, r := range replicasOf(replicas, v.Name) {
			if r.Node != "" && !slices.Contains(u.Nodes, r.Node) {
				u.Nodes = append(u.Nodes, r.Node)
			}
		}
		slices.Sort(u.Nodes)
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b Unpinned) int { return strings.Compare(a.Volume, b.Volume) })
	return out
}

// placementTimeout bounds the wait for Longhorn's manager to create the server's Longhorn node.
const placementTimeout = 5 * time.Minute

// PlacementStep keeps single-copy volumes on the server: it tags the server's Longhorn node
// ServerTag, which the class of one-copy volumes selects, and pins every volume of one copy that
// is not pinned yet (a volume made before its class selected the tag, or by another class).
// Copies already placed stay where they are; kip status lists one on a worker.
func PlacementStep(cl *kube.Clients) workflow.Step {
	pending := func(ctx context.Context) (server string, unpinned []Unpinned, err error) {
		n, err := cluster.ServerNode(ctx, cl.Kube)
		if err != nil {
			return "", nil, err
		}
		server = n.Name
		vols, err := cl.Longhorn.LonghornV1beta2().Volumes(Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", nil, fmt.Errorf("list Longhorn's volumes: %w", err)
		}
		return server, UnpinnedVolumes(vols.Items, nil), nil
	}
	return workflow.Step{
		Name: "server-copies", Title: "Keep single-copy volumes on the server (its Longhorn node tagged " + ServerTag + ", each such volume pinned to it)",
		Done: "Single-copy volumes stay on the server", Already: "Single-copy volumes already stay on the server",
		Check: func(ctx context.Context) (bool, error) {
			server, unpinned, err := pending(ctx)
			if err != nil || len(unpinned) > 0 {
				return false, err
			}
			return ServerTagged(ctx, cl, server)
		},
		Apply: func(ctx context.Context) error {
			server, unpinned, err := pending(ctx)
			if err != nil {
				return err
			}
			err = kube.Poll(ctx, placementTimeout, "Longhorn node "+server, func(ctx context.Context) (bool, string, error) {
				_, found, err := SchedulingAllowed(ctx, cl, server)
				return found, "Longhorn's manager has not created it yet", err
			})
			if err != nil {
				return err
			}
			if err := TagServer(ctx, cl, server); err != nil {
				return err
			}
			for _, u := range unpinned {
				if err := Pin(ctx, cl, u.Volume); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
			return nil
		},
	}
}
