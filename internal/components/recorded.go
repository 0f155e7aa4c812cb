package components

import (
	"errors"
	"fmt"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/manifests"
)

// Recorded returns the options that render the cluster as its record describes it: profile,
// storage, monitoring, server address, first admin and backup storage. Backup credentials are
// not recorded, so the cluster keeps its own. ExistingDexConfig is left for the caller to read
// (ReadDexConfig). kip install's re-runs and kip platform start from these options and change
// only what they were asked to, so that no recorded choice is lost.
func Recorded(rec cluster.Record, pinned *manifests.Versions, kipVersion string) (Options, error) {
	p, err := cluster.ProfileNamed(rec.Profile)
	if err != nil {
		return Options{}, fmt.Errorf("the cluster record names profile %q: %w", rec.Profile, err)
	}
	o := Options{
		Sizing:     cluster.Sizing{Profile: p, Storage: rec.Storage},
		Monitoring: rec.Monitoring, AdminEmail: rec.AdminEmail, ServerAddress: rec.Server,
		Pinned: pinned, KipVersion: kipVersion,
	}
	switch rec.Backups {
	case cluster.BackupsExternal:
		loc := rec.BackupLocation
		if loc == nil || loc.Bucket == "" {
			return o, errors.New("the cluster record says backups go to external storage but not to which bucket: " +
				"run kip install again with --backup-storage-bucket and its other flags")
		}
		o.Backups = &BackupStorage{Bucket: loc.Bucket, Endpoint: loc.Endpoint, Region: loc.Region}
	case cluster.BackupsNone:
		o.NoBackups = true
	case cluster.BackupsInCluster:
	default:
		return o, fmt.Errorf("the cluster record names backups %q: this kip knows %q, %q and none", rec.Backups, cluster.BackupsExternal, cluster.BackupsInCluster)
	}
	return o, nil
}

// BackupsOf is the backup mode and external location that o renders.
func BackupsOf(o Options) (string, *cluster.BackupLocation) {
	switch {
	case o.Backups != nil:
		return cluster.BackupsExternal, o.Backups.Location()
	case o.Sizing.Storage == cluster.StorageLonghorn && !o.NoBackups:
		return cluster.BackupsInCluster, nil
	}
	return cluster.BackupsNone, nil
}

// ConsoleURL is where the console answers for a cluster whose server is at address.
func ConsoleURL(address string) (string, error) {
	domain, err := publicDomain(address)
	if err != nil {
		return "", err
	}
	return "https://console." + domain, nil
}

// AdminPasswordCommand is a shell command that prints the first admin's generated password from
// the cluster at kubeconfig (the Secret kip creates once, which Dex reads the hash from).
func AdminPasswordCommand(kubeconfig string) string {
	return sshx.Command("kubectl", "--kubeconfig", kubeconfig, "-n", dexNamespace, "get", "secret", adminPasswordSecret,
		"-o", "jsonpath={.data.password}") + " | base64 -d; echo"
}
