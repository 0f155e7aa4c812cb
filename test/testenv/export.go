package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
)

// LonghornCRDs returns Longhorn's CRD manifests from the longhorn-manager module this checkout
// builds against (k8s/crds.yaml, rendered as the chart renders it: renderLonghornTemplate), for
// tests that stand in for what the Longhorn chart installs.
func LonghornCRDs() ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	const longhorn = "github.com/longhorn/longhorn-manager"
	dirs, err := moduleDirs(root, longhorn)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dirs[longhorn], "k8s", "crds.yaml"))
	if err != nil {
		return nil, fmt.Errorf("read Longhorn's CRDs: %w", err)
	}
	return renderLonghornTemplate(data, moduleVersion(dirs[longhorn])), nil
}

// InstallVeleroCRDs creates Velero's CRDs (v1 and v2alpha1, what its chart installs) from the velero
// module this checkout builds against, and waits until they are Established: for a lab cluster
// that runs Velero as the chart would.
func InstallVeleroCRDs(ctx context.Context, client apiextensionsclientset.Interface) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	sources, err := crdSources(root)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(sources, func(s crdSource) bool { return s.name == "velero" })
	crds, err := loadCRDs(sources[i : i+1])
	if err != nil {
		return err
	}
	return installCRDs(ctx, client, crds)
}

// LonghornVolumeSpec is a Volume spec that Longhorn's CRD schema admits (it requires a value for
// each of its enums): size bytes, replicas copies, everything else as Longhorn defaults it.
func LonghornVolumeSpec(size int64, replicas int) longhornv1beta2.VolumeSpec {
	return longhornv1beta2.VolumeSpec{
		Size: size, NumberOfReplicas: replicas, AccessMode: "rwo", DataEngine: "v1", DataLocality: "disabled",
		BackupBlockSize: 2 << 20, BackupCompressionMethod: "lz4", ReplicaAutoBalance: "ignored", SnapshotDataIntegrity: "ignored",
		ReplicaSoftAntiAffinity: "ignored", ReplicaZoneSoftAntiAffinity: "ignored", ReplicaDiskSoftAntiAffinity: "ignored",
		OfflineRebuilding: "ignored", FreezeFilesystemForSnapshot: "ignored", RestoreVolumeRecurringJob: "ignored", UnmapMarkSnapChainRemoved: "ignored",
	}
}
