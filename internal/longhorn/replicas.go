package longhorn

import (
	"context"
	"fmt"
	"slices"
	"strings"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/kube"
)

// Driver is Longhorn's CSI driver, the provisioner of its volumes.
const Driver = "driver.longhorn.io"

// Replica is one Longhorn replica of a volume's data (a copy, in kip's messages), with Longhorn's
// timestamps of it.
type Replica struct {
	Node string `json:"node"`
	// Current is a replica healthy since it last failed (CurrentReplica).
	Current       bool   `json:"current"`
	HealthyAt     string `json:"healthyAt,omitempty"`
	LastHealthyAt string `json:"lastHealthyAt,omitempty"`
	FailedAt      string `json:"failedAt,omitempty"`
	LastFailedAt  string `json:"lastFailedAt,omitempty"`
	// Unsure says why a replica Longhorn calls current is not known to be (Distrust).
	Unsure string `json:"unsure,omitempty"`
}

func (c Replica) String() string {
	state := "not current"
	switch {
	case c.Unsure != "":
		state = "not known to be current: " + c.Unsure
	case c.Current:
		state = "current"
	}
	return fmt.Sprintf("on %s: %s (healthy at %s, last healthy at %s, failed at %s, last failed at %s)",
		c.Node, state, orNever(c.HealthyAt), orNever(c.LastHealthyAt), orNever(c.FailedAt), orNever(c.LastFailedAt))
}

func orNever(t string) string {
	if t == "" {
		return "never"
	}
	return t
}

// VolumeReplicas is a claim's Longhorn volume and the replicas Longhorn keeps of it.
type VolumeReplicas struct {
	Claim  string `json:"claim"`
	Volume string `json:"volume"`
	// Wanted is how many replicas Longhorn keeps of the volume (its spec.numberOfReplicas).
	Wanted   int       `json:"wanted"`
	Replicas []Replica `json:"copies"`
}

// How a workload's data stands when one node is gone (Judge).
const (
	// DataCurrent: another node holds a current replica of every volume.
	DataCurrent = "current"
	// DataStale: every volume has a replica on another node, but some only replicas that may be older.
	DataStale = "stale"
	// DataOnlyThere: some volume has no replica on any other node.
	DataOnlyThere = "only-there"
)

// Judge says how the data of vols stands without node gone: DataCurrent, DataStale or
// DataOnlyThere, the worst of its volumes.
func Judge(vols []VolumeReplicas, gone string) string {
	verdict := DataCurrent
	for _, v := range vols {
		elsewhere, current := false, false
		for _, c := range v.Replicas {
			if c.Node != "" && c.Node != gone {
				elsewhere = true
				current = current || c.Current
			}
		}
		switch {
		case !elsewhere:
			return DataOnlyThere
		case !current:
			verdict = DataStale
		}
	}
	return verdict
}

// CurrentOn names the nodes other than gone that hold a current replica of every volume of vols,
// sorted.
func CurrentOn(vols []VolumeReplicas, gone string) []string {
	var nodes []string
	for i, v := range vols {
		var here []string
		for _, c := range v.Replicas {
			if c.Current && c.Node != gone && c.Node != "" {
				here = append(here, c.Node)
			}
		}
		if i == 0 {
			nodes = here
		} else {
			nodes = slices.DeleteFunc(nodes, func(n string) bool { return !slices.Contains(here, n) })
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	slices.Sort(nodes)
	return slices.Compact(nodes)
}

// Distrust takes back "current" from the replicas, on nodes other than gone, of each volume in
// cutOff (Longhorn volume names): volumes whose engine ran on gone while gone could not reach the
// server. Longhorn's managers record a replica's failure through the API server, and the one that
// owns a volume's engine is the manager of the engine's node: cut off from the server, an engine
// that lost a replica elsewhere keeps writing the replicas it reaches, and nothing records it. So
// Longhorn's "healthy since it last failed" is only what gone reported before it lost the server,
// and writes after that may be missing from every copy but gone's.
func Distrust(vols []VolumeReplicas, cutOff []string, gone string) {
	for i := range vols {
		if !slices.Contains(cutOff, vols[i].Volume) {
			continue
		}
		for j := range vols[i].Replicas {
			if r := &vols[i].Replicas[j]; r.Node != gone && r.Current {
				r.Current = false
				r.Unsure = "its engine ran on " + gone + ", which could not reach the server, so Longhorn could not record the writes this copy missed"
			}
		}
	}
}

// Describe lists every replica of vols with its timestamps, a line each, for an operator deciding
// whether to accept older data.
func Describe(vols []VolumeReplicas) []string {
	var lines []string
	for _, v := range vols {
		if len(v.Replicas) == 0 {
			lines = append(lines, fmt.Sprintf("claim %s (Longhorn volume %s): no copy", v.Claim, v.Volume))
		}
		for _, c := range v.Replicas {
			lines = append(lines, fmt.Sprintf("claim %s (Longhorn volume %s) %s", v.Claim, v.Volume, c))
		}
	}
	return lines
}

// VolumeName is the Longhorn volume behind pv, "" when pv is not Longhorn's.
func VolumeName(pv *corev1.PersistentVolume) string {
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != Driver {
		return ""
	}
	return pv.Spec.CSI.VolumeHandle
}

// SingleNode reports whether pv can be attached to one node at a time (ReadWriteOnce or
// ReadWriteOncePod): its data follows the node it is attached to.
func SingleNode(pv *corev1.PersistentVolume) bool {
	return !slices.Contains(pv.Spec.AccessModes, corev1.ReadWriteMany) && !slices.Contains(pv.Spec.AccessModes, corev1.ReadOnlyMany)
}

// ReadReplicas reads the Longhorn volumes behind the claims of namespace that exist and are bound
// to a Longhorn volume, with their replicas, in the order of claims.
func ReadReplicas(ctx context.Context, cl *kube.Clients, namespace string, claims []string) ([]VolumeReplicas, error) {
	var out []VolumeReplicas
	for _, claim := range claims {
		pvc, err := cl.Kube.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read claim %s/%s: %w", namespace, claim, err)
		}
		if pvc.Spec.VolumeName == "" {
			continue
		}
		pv, err := cl.Kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("read volume %s of claim %s/%s: %w", pvc.Spec.VolumeName, namespace, claim, err)
		}
		vol := VolumeName(pv)
		if vol == "" {
			continue
		}
		vc, err := ReadVolumeReplicas(ctx, cl, claim, vol)
		if err != nil {
			return nil, err
		}
		out = append(out, vc)
	}
	return out, nil
}

// ReadVolumeReplicas reads Longhorn volume vol, claim's, with the replicas it keeps.
func ReadVolumeReplicas(ctx context.Context, cl *kube.Clients, claim, vol string) (VolumeReplicas, error) {
	lv, err := cl.Longhorn.LonghornV1beta2().Volumes(Namespace).Get(ctx, vol, metav1.GetOptions{})
	if err != nil {
		return VolumeReplicas{}, fmt.Errorf("read Longhorn volume %s of claim %s: %w", vol, claim, err)
	}
	replicas, err := listReplicas(ctx, cl, vol)
	if err != nil {
		return VolumeReplicas{}, err
	}
	return VolumeReplicas{Claim: claim, Volume: vol, Wanted: lv.Spec.NumberOfReplicas, Replicas: replicas}, nil
}

// listReplicas are the replicas Longhorn keeps of volume, by node.
func listReplicas(ctx context.Context, cl *kube.Clients, volume string) ([]Replica, error) {
	// Longhorn labels each replica with its volume.
	list, err := cl.Longhorn.LonghornV1beta2().Replicas(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + volume})
	if err != nil {
		return nil, fmt.Errorf("list the replicas of Longhorn volume %s: %w", volume, err)
	}
	return replicasOf(list.Items, volume), nil
}

// replicasOf are the replicas of volume among all, by node.
func replicasOf(replicas []longhornv1beta2.Replica, volume string) []Replica {
	var out []Replica
	for i := range replicas {
		if r := &replicas[i]; r.Spec.VolumeName == volume {
			out = append(out, Replica{Node: r.Spec.NodeID, Current: CurrentReplica(r), HealthyAt: r.Spec.HealthyAt, LastHealthyAt: r.Spec.LastHealthyAt,
				FailedAt: r.Spec.FailedAt, LastFailedAt: r.Spec.LastFailedAt})
		}
	}
	slices.SortFunc(out, func(a, b Replica) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// ReplicasIn is ReadReplicas from lists already read: the Longhorn volumes (each names its claim in
// its Kubernetes status) and their replicas.
func ReplicasIn(vols []longhornv1beta2.Volume, replicas []longhornv1beta2.Replica, namespace string, claims []string) []VolumeReplicas {
	var out []VolumeReplicas
	for _, claim := range claims {
		i := slices.IndexFunc(vols, func(v longhornv1beta2.Volume) bool {
			ks := v.Status.KubernetesStatus
			return ks.Namespace == namespace && ks.PVCName == claim
		})
		if i < 0 {
			continue
		}
		out = append(out, VolumeReplicas{Claim: claim, Volume: vols[i].Name, Wanted: vols[i].Spec.NumberOfReplicas, Replicas: replicasOf(replicas, vols[i].Name)})
	}
	return out
}
