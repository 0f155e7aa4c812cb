package install

import (
	"context"
	"time"

	"k8s.io/client-go/dynamic"

	"kipper.run/kip/internal/kube"
)

// ClusterRecordName is the cluster's own record, kipper.run/cluster on kube.ClusterRecords():
// what install decided and installed. docs/records.md documents it.
const ClusterRecordName = "cluster"

// clusterRecordVersion is the format of ClusterRecord.
const clusterRecordVersion = 1

// Network modes: the flannel backend of the pod network.
const (
	NetworkWireGuard = "wireguard-native"
	NetworkVXLAN     = "vxlan"
)

// ClusterRecord is what kip install recorded about the cluster.
type ClusterRecord struct {
	// Profile is the sizing profile (nano, small, standard, large).
	Profile string `json:"profile"`
	// Storage is the storage mode: local or longhorn. It only ever moves from local to longhorn,
	// and kip install never changes it on an existing cluster.
	Storage string `json:"storage"`
	// Network is the pod network's flannel backend: wireguard-native or vxlan.
	Network string `json:"network"`
	// Server is the address kip reaches the server at over SSH and the API.
	Server string `json:"server"`
	// KipVersion is the kip that installed or last re-ran install on the cluster.
	KipVersion string `json:"kipVersion"`
	// Versions are the component versions that kip installed, by component name.
	Versions map[string]string `json:"versions"`
	// Monitoring says which of Prometheus (with Grafana) and Loki are on.
	Monitoring Monitoring `json:"monitoring"`
	// Backups is where Velero keeps backups: "" (none), "external" (--backup-storage-bucket) or
	// "in-cluster" (MinIO on a Longhorn cluster).
	Backups     string    `json:"backups,omitempty"`
	InstalledAt time.Time `json:"installedAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
}

// Monitoring is which monitoring components are on.
type Monitoring struct {
	Prometheus bool `json:"prometheus"`
	Loki       bool `json:"loki"`
}

// ReadClusterRecord reads the cluster record; found is false on a cluster kip has not installed.
func ReadClusterRecord(ctx context.Context, dyn dynamic.Interface) (rec ClusterRecord, found bool, err error) {
	return kube.ReadRecord[ClusterRecord](ctx, dyn, kube.ClusterRecords(), ClusterRecordName, clusterRecordVersion)
}

// UpdateClusterRecord changes the cluster record with mutate (found is false when there is none
// yet) and stamps UpdatedAt.
func UpdateClusterRecord(ctx context.Context, dyn dynamic.Interface, mutate func(rec *ClusterRecord, found bool) error) (ClusterRecord, error) {
	return kube.UpdateRecord(ctx, dyn, kube.ClusterRecords(), ClusterRecordName, clusterRecordVersion,
		func(rec *ClusterRecord, found bool) error {
			if err := mutate(rec, found); err != nil {
				return err
			}
			rec.UpdatedAt = time.Now().UTC()
			return nil
		})
}
