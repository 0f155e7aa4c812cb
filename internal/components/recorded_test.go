package components

import (
	"slices"
	"strings"
	"testing"

	"kipper.run/kip/internal/cluster"
)

// TestRecordedKeepsEveryChoice: rendering from a cluster record keeps its external backup
// storage (without replacing the credentials the cluster holds), its first admin's email on the
// ClusterIssuer, its profile, storage and monitoring. Before, a re-run or kip platform without
// the flags rendered MinIO and a Velero pointed at it, and a ClusterIssuer without an email.
func TestRecordedKeepsEveryChoice(t *testing.T) {
	rec := cluster.Record{
		Profile: "small", Storage: cluster.StorageLonghorn, Network: cluster.NetworkVXLAN, Server: "203.0.113.10",
		Monitoring: cluster.Monitoring{Prometheus: true}, AdminEmail: "admin@example.com",
		Backups:        cluster.BackupsExternal,
		BackupLocation: &cluster.BackupLocation{Bucket: "backups", Endpoint: "https://s3.example.com", Region: "eu-west-1"},
	}
	o, err := Recorded(rec, testPinned(t), "v0.40.0")
	if err != nil {
		t.Fatal(err)
	}
	comps := renderComponents(t, o)
	names := componentNames(comps)
	if slices.Contains(names, "minio") || slices.Contains(names, "loki") || !slices.Contains(names, "prometheus") || !slices.Contains(names, "longhorn") {
		t.Fatalf("components %v: want longhorn, prometheus, no loki, no minio", names)
	}
	velero := componentNamed(t, comps, "velero")
	_, values := chartValues(t, velero)
	bsl := nestedValue(values, "configuration", "backupStorageLocation").([]any)[0].(map[string]any)
	if bsl["bucket"] != "backups" || nestedValue(bsl, "config", "s3Url") != "https://s3.example.com" || nestedValue(bsl, "config", "region") != "eu-west-1" {
		t.Errorf("backup location %v", bsl)
	}
	if nestedValue(values, "credentials", "existingSecret") != VeleroCredentialsSecret {
		t.Errorf("velero reads credentials %v", nestedValue(values, "credentials"))
	}
	for _, obj := range append(append(slices.Clone(velero.Objects), velero.CreateOnly...), velero.After...) {
		if obj.GetKind() == "Secret" {
			t.Errorf("a render without credentials carries Secret %s: it would replace the cluster's keys", obj.GetName())
		}
	}
	issuer := findObject(t, componentNamed(t, comps, "cert-manager").After, "ClusterIssuer", "", clusterIssuer)
	if email := nestedValue(issuer.Object, "spec", "acme", "email"); email != "admin@example.com" {
		t.Errorf("ClusterIssuer email %v, want the recorded admin's", email)
	}

	// The record and the options agree on the backup mode.
	if mode, loc := BackupsOf(o); mode != cluster.BackupsExternal || *loc != *rec.BackupLocation {
		t.Errorf("BackupsOf = %s %+v", mode, loc)
	}
	in := rec
	in.Backups, in.BackupLocation = cluster.BackupsInCluster, nil
	if o, err := Recorded(in, testPinned(t), "v0.40.0"); err != nil || !slices.Contains(componentNames(renderComponents(t, o)), "minio") {
		t.Errorf("in-cluster record: %v", err)
	}
}

func TestRecordedRefusesWhatItCannotRender(t *testing.T) {
	for name, rec := range map[string]cluster.Record{
		"external without a bucket": {Profile: "nano", Storage: cluster.StorageLocal, Server: "203.0.113.10", Backups: cluster.BackupsExternal},
		"unknown backups":           {Profile: "nano", Storage: cluster.StorageLocal, Server: "203.0.113.10", Backups: "tape"},
		"unknown profile":           {Profile: "huge", Storage: cluster.StorageLocal, Server: "203.0.113.10"},
	} {
		if _, err := Recorded(rec, testPinned(t), "v0.40.0"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	_, err := Recorded(cluster.Record{Profile: "nano", Storage: cluster.StorageLocal, Backups: cluster.BackupsExternal}, testPinned(t), "v")
	if err == nil || !strings.Contains(err.Error(), "--backup-storage-bucket") {
		t.Errorf("external without a bucket: %v, want the flag that fixes it", err)
	}
}
