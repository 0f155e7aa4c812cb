package cluster

import (
	"context"
	"errors"
	"maps"
	"time"

	"k8s.io/client-go/dynamic"

	"kipper.run/kip/internal/kube"
)

// RecordName is the cluster's own record, kipper.run/cluster on kube.ClusterRecords():
// what install decided and installed. docs/records.md documents it.
const RecordName = "cluster"

// recordVersion is the format of Record.
const recordVersion = 1

// Network modes: the flannel backend of the pod network.
const (
	NetworkWireGuard = "wireguard-native"
	NetworkVXLAN     = "vxlan"
)

// Where k3s and Longhorn keep their data on a node.
const (
	RancherDir  = "/var/lib/rancher"
	LonghornDir = "/var/lib/longhorn"
	// LocalStorageDir is where the local-path provisioner keeps local volumes, one directory each,
	// named <pv>_<namespace>_<claim>.
	LocalStorageDir = "/var/lib/rancher/k3s/storage"
)

// LonghornOneCopyClass is the StorageClass of a service's data on Longhorn with one copy (data
// locality and auto-balance off): what kip service storage longhorn moves a service onto.
const LonghornOneCopyClass = "kipper-longhorn-1"

// LonghornTwoCopiesClass is the class of the data volume of a service created with two copies
// (kip service add --copies 2), each on a different node; the offer (kip cluster storage
// --max-copies 2) creates it.
const LonghornTwoCopiesClass = "kipper-longhorn-2"

// MaxCopiesOffered is the most copies of a service's data Kipper supports.
const MaxCopiesOffered = 2

// Backup modes: where Velero keeps the cluster's backups.
const (
	BackupsNone      = ""           // no Velero (local storage without --backup-storage-bucket)
	BackupsExternal  = "external"   // an S3 bucket given with --backup-storage-bucket
	BackupsInCluster = "in-cluster" // MinIO on the cluster's Longhorn storage
)

// ServerHost is the server's SSH address: saved, the address saved for the cluster, when kip
// has one; else the one the record names.
func (r Record) ServerHost(saved string) (string, error) {
	switch {
	case saved != "":
		return saved, nil
	case r.Server != "":
		return r.Server, nil
	}
	return "", errors.New("no SSH address for the server is known (no saved cluster, and the cluster record names none): pass --cluster with a cluster saved by kip install")
}

// Record is what kip install recorded about the cluster.
type Record struct {
	// Profile is the sizing profile (nano, small, standard, large).
	Profile string `json:"profile"`
	// Storage is the storage mode: local or longhorn. It only ever moves from local to longhorn,
	// and kip install never changes it on an existing cluster.
	Storage string `json:"storage"`
	// Network is the pod network's flannel backend: wireguard-native or vxlan.
	Network string `json:"network"`
	// Server is the address kip reaches the server at over SSH and the API.
	Server string `json:"server"`
	// KipVersion is the kip that installed the cluster, or last re-ran install or upgraded it.
	KipVersion string `json:"kipVersion"`
	// Versions are the component versions that kip installed, by component name.
	Versions map[string]string `json:"versions"`
	// Monitoring says which of Prometheus (with Grafana) and Loki are on.
	Monitoring Monitoring `json:"monitoring"`
	// Backups is where Velero keeps backups: BackupsNone, BackupsExternal or BackupsInCluster.
	Backups string `json:"backups,omitempty"`
	// BackupLocation is the external bucket when Backups is BackupsExternal. Its credentials are
	// not recorded: they stay in the cluster (velero/velero-credentials) until a run with the
	// backup flags replaces them.
	BackupLocation *BackupLocation `json:"backupLocation,omitempty"`
	// AdminEmail is the console's first admin (--admin-email), also the email of the ACME
	// account that gets the console's and Dex's certificates; "" when none was given.
	AdminEmail string `json:"adminEmail,omitempty"`
	// MaxCopies is the most copies of its data a new service may have: 2 once an admin offered
	// two copies (kip cluster storage --max-copies 2), 0 (one copy) before. Install keeps it.
	MaxCopies   int       `json:"maxCopies,omitempty"`
	InstalledAt time.Time `json:"installedAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
}

// Copies is the most copies of its data a new service may have: 1 until two are offered.
func (a Record) Copies() int { return max(a.MaxCopies, 1) }

// Same compares the fields an install run decides, not its timestamps or the copies offer.
func (a Record) Same(b Record) bool {
	return a.Profile == b.Profile && a.Storage == b.Storage && a.Network == b.Network && a.Server == b.Server &&
		a.KipVersion == b.KipVersion && maps.Equal(a.Versions, b.Versions) && a.Monitoring == b.Monitoring && a.Backups == b.Backups &&
		a.BackupLocation.Equal(b.BackupLocation) && a.AdminEmail == b.AdminEmail
}

// BackupLocation is an S3-compatible bucket, without its credentials. Endpoint is empty for
// AWS S3; Region empty means us-east-1.
type BackupLocation struct {
	Bucket   string `json:"bucket"`
	Endpoint string `json:"endpoint,omitempty"`
	Region   string `json:"region,omitempty"`
}

// Equal reports whether a and b name the same bucket; two nil locations are equal.
func (a *BackupLocation) Equal(b *BackupLocation) bool {
	return a == b || a != nil && b != nil && *a == *b
}

// Monitoring is which monitoring components are on.
type Monitoring struct {
	Prometheus bool `json:"prometheus"`
	Loki       bool `json:"loki"`
}

// ReadRecord reads the cluster record; found is false on a cluster kip has not installed.
func ReadRecord(ctx context.Context, dyn dynamic.Interface) (rec Record, found bool, err error) {
	return kube.ReadRecord[Record](ctx, dyn, kube.ClusterRecords(), RecordName, recordVersion)
}

// RecordIn decodes the cluster record from the annotations of kube.ClusterRecords() (see
// kube.ReadAnnotations).
func RecordIn(annotations map[string]string) (rec Record, found bool, err error) {
	return kube.RecordFrom[Record](kube.ClusterRecords(), annotations, RecordName, recordVersion)
}

// ReadInstalled reads the record of a cluster kip installed, and refuses one it did not install.
func ReadInstalled(ctx context.Context, dyn dynamic.Interface) (Record, error) {
	rec, found, err := ReadRecord(ctx, dyn)
	if err == nil && !found {
		err = errors.New("this cluster has no Kipper record (kipper.run/cluster): install it with 'kip install --host HOST' first")
	}
	return rec, err
}

// UpdateRecord changes the cluster record with mutate (found is false when there is none
// yet) and stamps UpdatedAt.
func UpdateRecord(ctx context.Context, dyn dynamic.Interface, mutate func(rec *Record, found bool) error) (Record, error) {
	return kube.UpdateRecord(ctx, dyn, kube.ClusterRecords(), RecordName, recordVersion,
		func(rec *Record, found bool) error {
			if err := mutate(rec, found); err != nil {
				return err
			}
			rec.UpdatedAt = time.Now().UTC()
			return nil
		})
}

// Intent is what one run of kip install decided before it changed anything: kept on the
// server (install's IntentPath) from its first host change until it finishes, so that a run
// after an interruption continues that install, or refuses naming what its flags would change,
// and never does half of each. It holds no secret.
type Intent struct {
	Profile        string          `json:"profile"`
	Storage        string          `json:"storage"`
	Network        string          `json:"network"`
	Backups        string          `json:"backups,omitempty"`
	BackupLocation *BackupLocation `json:"backupLocation,omitempty"`
	AdminEmail     string          `json:"adminEmail,omitempty"`
	// StartedBy is the command line that started the install, StartedAt when.
	StartedBy string    `json:"startedBy"`
	StartedAt time.Time `json:"startedAt"`
}

// Choices are the record's choices as an install intent states them.
func (a Record) Choices() Intent {
	return Intent{Profile: a.Profile, Storage: a.Storage, Network: a.Network, Backups: a.Backups,
		BackupLocation: a.BackupLocation, AdminEmail: a.AdminEmail}
}

// Same reports whether two intents decide the same cluster (who started them and when aside).
func (i Intent) Same(o Intent) bool {
	i.StartedBy, i.StartedAt, o.StartedBy, o.StartedAt = "", time.Time{}, "", time.Time{}
	return i.Profile == o.Profile && i.Storage == o.Storage && i.Network == o.Network && i.Backups == o.Backups &&
		i.BackupLocation.Equal(o.BackupLocation) && i.AdminEmail == o.AdminEmail
}
