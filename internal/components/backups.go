package components

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

// minio is in-cluster backup storage on a Longhorn cluster without external storage: MinIO on a
// Longhorn volume, in Velero's namespace so that both read the credentials kip generates once.
// (The platform's other volumes, the registry's, Prometheus's and Loki's, stay on the server's
// disk in k3s's local-path class whatever the cluster's storage.)
func (r *renderer) minio() (Component, error) {
	c, err := r.chartComponent("minio", VeleroNamespace, map[string]any{
		"mode":           "standalone",
		"replicas":       1,
		"existingSecret": minioCredentialsSecret,
		"persistence":    map[string]any{"enabled": true, "size": minioVolumeSize, "storageClass": longhornClass},
		"resources":      map[string]any{"requests": map[string]any{"memory": "256Mi"}},
		// The chart's default adds a user with a well-known password.
		"users":   []any{},
		"buckets": []any{map[string]any{"name": minioBucket, "policy": "none", "purge": false}},
	})
	if err != nil {
		return Component{}, err
	}
	password, err := randomToken(24)
	if err != nil {
		return Component{}, err
	}
	err = collect(&c.CreateOnly, typed("v1", "Secret", &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: minioCredentialsSecret, Namespace: VeleroNamespace},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			"rootUser":           []byte(minioRootUser),
			"rootPassword":       []byte(password),
			VeleroCredentialsKey: AWSCredentials(minioRootUser, password),
		},
	}))
	return c, err
}

// velero backs up to the external storage when there is one, else to in-cluster MinIO.
func (r *renderer) velero() (Component, error) {
	plugin, err := r.pin("velero-plugin-for-aws")
	if err != nil {
		return Component{}, err
	}
	pin, err := r.pin("velero")
	if err != nil {
		return Component{}, err
	}
	location := map[string]any{
		"name":     BackupLocation,
		"provider": "aws",
		"default":  true,
	}
	credentials := minioCredentialsSecret
	var extra []func() (*unstructured.Unstructured, error)
	if b := r.o.Backups; b != nil {
		region := b.Region
		if region == "" {
			region = defaultBackupRegion
		}
		config := map[string]any{"region": region}
		if b.Endpoint != "" {
			config["s3Url"] = b.Endpoint
			config["s3ForcePathStyle"] = "true"
		}
		location["bucket"] = b.Bucket
		location["config"] = config
		credentials = VeleroCredentialsSecret
		// Replaced on every run that gives them: re-running install is how operators rotate
		// backup keys. Without them the cluster's Secret stays.
		if !b.keepsCredentials() {
			extra = append(extra, typed("v1", "Secret", &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: VeleroCredentialsSecret, Namespace: VeleroNamespace},
				Type:       corev1.SecretTypeOpaque,
				Data:       map[string][]byte{VeleroCredentialsKey: AWSCredentials(b.AccessKeyID, b.SecretAccessKey)},
			}))
		}
	} else {
		location["bucket"] = minioBucket
		location["config"] = map[string]any{
			"region":           "minio",
			"s3Url":            "http://minio." + VeleroNamespace + ".svc:9000",
			"s3ForcePathStyle": "true",
		}
	}
	return r.chartComponent("velero", VeleroNamespace, map[string]any{
		"image": map[string]any{"repository": pin.Image, "tag": pin.Version},
		"initContainers": []any{map[string]any{
			"name":            "velero-plugin-for-aws",
			"image":           plugin.Image + ":" + plugin.Version,
			"imagePullPolicy": "IfNotPresent",
			"volumeMounts":    []any{map[string]any{"mountPath": "/target", "name": "plugins"}},
		}},
		"credentials": map[string]any{"useSecret": true, "existingSecret": credentials},
		"configuration": map[string]any{
			"backupStorageLocation":    []any{location},
			"volumeSnapshotLocation":   []any{},
			"uploaderType":             "kopia",
			"defaultVolumesToFsBackup": true,
		},
		// File-system backups of every volume, through the node agent.
		"deployNodeAgent":  true,
		"snapshotsEnabled": false,
	}, extra...)
}

// AWSCredentials is the credentials file Velero's AWS plugin reads (key VeleroCredentialsKey of the
// credentials Secret).
func AWSCredentials(id, secret string) []byte {
	return []byte("[default]\naws_access_key_id=" + id + "\naws_secret_access_key=" + secret + "\n")
}

// --- Dex ---------------------------------------------------------------------------------------
