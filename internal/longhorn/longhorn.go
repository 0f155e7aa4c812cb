// Package longhorn is kip's knowledge of Longhorn: its namespace, CSI driver and settings, its
// disks' room for a new replica, the CPU its engine requests on a node, and the replicas it keeps
// of a volume (copies, in kip's messages) and how a workload's data stands when a node is gone.
package longhorn

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/kube"
)

// Longhorn's namespace and the settings that decide how much a disk can take.
const (
	Namespace                  = "longhorn-system"
	settingMinimalAvailable    = "storage-minimal-available-percentage"
	settingOverProvisioning    = "storage-over-provisioning-percentage"
	settingReplicaTimeout      = "engine-replica-timeout"
	defaultMinimalAvailable    = 25
	defaultOverProvisioningPct = 100
	defaultReplicaTimeout      = 8
)

// Settings are the settings kip reads, with one list of Longhorn's settings: the
// scheduling ones, and how many seconds an engine waits for a replica before marking it failed.
type Settings struct{ MinimalAvailable, OverProvisioning, ReplicaTimeout int64 }

// ReadSettings reads them, with Longhorn's defaults for those not set. A setting stored
// per data engine ({"v1":"8","v2":"8"}) is read for the v1 engine, which kip's volumes use.
func ReadSettings(ctx context.Context, c *kube.Clients) (Settings, error) {
	s := Settings{MinimalAvailable: defaultMinimalAvailable, OverProvisioning: defaultOverProvisioningPct, ReplicaTimeout: defaultReplicaTimeout}
	list, err := c.Longhorn.LonghornV1beta2().Settings(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return s, fmt.Errorf("list longhorn settings: %w", err)
	}
	dst := map[string]*int64{settingMinimalAvailable: &s.MinimalAvailable, settingOverProvisioning: &s.OverProvisioning, settingReplicaTimeout: &s.ReplicaTimeout}
	for _, st := range list.Items {
		if p := dst[st.Name]; p != nil {
			if n, err := strconv.ParseInt(v1Value(st.Value), 10, 64); err == nil {
				*p = n
			}
		}
	}
	return s, nil
}

// v1Value is a setting's value for the v1 data engine: the value itself, or the v1 entry of the
// per-engine form.
func v1Value(stored string) string {
	var perEngine map[string]string
	if err := json.Unmarshal([]byte(stored), &perEngine); err == nil {
		return strings.TrimSpace(perEngine["v1"])
	}
	return strings.TrimSpace(stored)
}

// Schedulable is what Longhorn can still schedule onto a disk, by the two rules of its replica
// scheduler: the replicas scheduled stay within (maximum − reserved) × over-provisioning%, and
// the space available stays above minimal-available% of the maximum.
func Schedulable(spec longhornv1beta2.DiskSpec, st *longhornv1beta2.DiskStatus, s Settings) int64 {
	if st == nil || st.StorageMaximum <= 0 {
		return 0
	}
	byScheduling := (st.StorageMaximum-spec.StorageReserved)*s.OverProvisioning/100 - st.StorageScheduled
	byAvailable := st.StorageAvailable - st.StorageMaximum*s.MinimalAvailable/100
	return max(0, min(byScheduling, byAvailable))
}

// DiskEligible says Longhorn may schedule onto the disk.
func DiskEligible(n *longhornv1beta2.Node, spec longhornv1beta2.DiskSpec, st *longhornv1beta2.DiskStatus) bool {
	if !n.Spec.AllowScheduling || n.Spec.EvictionRequested || !spec.AllowScheduling || spec.EvictionRequested || st == nil {
		return false
	}
	for _, c := range st.Conditions {
		if c.Type == longhornv1beta2.DiskConditionTypeReady {
			return c.Status == longhornv1beta2.ConditionStatusTrue
		}
	}
	return false
}

// Room refuses when no eligible disk of Longhorn's node can take a new replica of size
// by Longhorn's own scheduling rules (Schedulable).
func Room(ctx context.Context, c *kube.Clients, node string, size int64) error {
	n, err := c.Longhorn.LonghornV1beta2().Nodes(Namespace).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read Longhorn node %s: %w", node, err)
	}
	s, err := ReadSettings(ctx, c)
	if err != nil {
		return err
	}
	best := int64(-1)
	for name, spec := range n.Spec.Disks {
		if st := n.Status.DiskStatus[name]; DiskEligible(n, spec, st) {
			best = max(best, Schedulable(spec, st, s))
		}
	}
	switch {
	case best < 0:
		return fmt.Errorf("no Longhorn disk on node %s is eligible for new volumes ('kip status' shows Longhorn's disks)", node)
	case best < size:
		return fmt.Errorf("Longhorn's roomiest disk on node %s can take %.1f GiB more and the move needs %.1f GiB: free disk space under /var/lib/longhorn first",
			node, float64(best)/(1<<30), float64(size)/(1<<30))
	}
	return nil
}

// CurrentReplica reports whether a Longhorn replica is healthy and has been since it last
// failed: a current copy of its volume's data, in kip's messages.
func CurrentReplica(r *longhornv1beta2.Replica) bool {
	return r.DeletionTimestamp == nil && r.Spec.FailedAt == "" && r.Spec.HealthyAt != "" &&
		(r.Spec.LastFailedAt == "" || r.Spec.LastHealthyAt > r.Spec.LastFailedAt)
}

// WorkerReplica is a Longhorn volume with no current replica on a server: the nodes that hold its
// replicas, all of them workers. Losing those workers can lose the volume's data.
type WorkerReplica struct {
	Volume    string   `json:"volume"`
	Namespace string   `json:"namespace,omitempty"`
	Claim     string   `json:"claim,omitempty"`
	Nodes     []string `json:"nodes"`
}

// Sentence says what c is, for a warning.
func (c WorkerReplica) Sentence() string {
	what := "Longhorn volume " + c.Volume
	if c.Claim != "" {
		what += " (claim " + c.Namespace + "/" + c.Claim + ")"
	}
	return what + " has no current copy on the server, only on " + strings.Join(c.Nodes, ", ") + ": losing that node can lose its data"
}

// WorkerReplicas are the volumes among vols whose replicas include none current
// (CurrentReplica) on a node isServer names, and at least one on another node, sorted by volume.
func WorkerReplicas(vols []longhornv1beta2.Volume, replicas []longhornv1beta2.Replica, isServer func(node string) bool) []WorkerReplica {
	on, currentElsewhere := splitReplicas(replicas, func(n string) bool { return !isServer(n) })
	var out []WorkerReplica
	for i := range vols {
		v := &vols[i]
		if nodes := on[v.Name]; len(nodes) > 0 && !currentElsewhere[v.Name] {
			ks := v.Status.KubernetesStatus
			out = append(out, WorkerReplica{Volume: v.Name, Namespace: ks.Namespace, Claim: ks.PVCName, Nodes: nodes})
		}
	}
	slices.SortFunc(out, func(a, b WorkerReplica) int { return strings.Compare(a.Volume, b.Volume) })
	return out
}

// OnlyReplicasOn names the volumes with a replica on node and no current one on any other node,
// sorted: their data is unavailable while node is down.
func OnlyReplicasOn(replicas []longhornv1beta2.Replica, node string) []string {
	on, currentElsewhere := splitReplicas(replicas, func(n string) bool { return n == node })
	var out []string
	for v := range on {
		if !currentElsewhere[v] {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// splitReplicas groups replicas by volume: the nodes in names that hold one (sorted), and
// whether a node outside them holds a current one. A replica on no node counts for neither.
func splitReplicas(replicas []longhornv1beta2.Replica, in func(node string) bool) (on map[string][]string, currentElsewhere map[string]bool) {
	on, currentElsewhere = map[string][]string{}, map[string]bool{}
	for i := range replicas {
		r := &replicas[i]
		switch n, v := r.Spec.NodeID, r.Spec.VolumeName; {
		case n == "":
		case !in(n):
			currentElsewhere[v] = currentElsewhere[v] || CurrentReplica(r)
		case !slices.Contains(on[v], n):
			on[v] = append(on[v], n)
			slices.Sort(on[v])
		}
	}
	return on, currentElsewhere
}
