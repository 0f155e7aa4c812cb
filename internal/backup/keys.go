package backup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
)

// The keys a recovery cluster needs besides the bucket's credentials: Velero's repository key,
// without which no file-system backup can be read, and the SSE-C key when the bucket's objects
// are encrypted with one.
const (
	// RepositoryKeySecret and RepositoryKeyField are where Velero keeps the repository key
	// (velero's pkg/repository/keys).
	RepositoryKeySecret = "velero-repo-credentials"
	RepositoryKeyField  = "repository-password"
	// sseKeyConfig is the AWS plugin's BackupStorageLocation setting naming the SSE-C key file
	// inside the Velero pod.
	sseKeyConfig = "customerKeyEncryptionFile"
)

// ExportOptions are kip backup repository-key export's and sse-key export's.
type ExportOptions struct {
	Options
	// To is the file the key is written to, mode 0600; it must not exist.
	To string
}

// ExportRepositoryKey writes Velero's repository key to o.To.
func ExportRepositoryKey(ctx context.Context, o *ExportOptions) error {
	e, err := load(ctx, &o.Options)
	if err != nil {
		return err
	}
	key, err := e.secretValue(ctx, RepositoryKeySecret, RepositoryKeyField)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("Velero has no repository key yet (Secret %s/%s): the Velero server creates it when it starts; 'kip status' shows whether Velero runs", components.VeleroNamespace, RepositoryKeySecret)
	}
	if err != nil {
		return err
	}
	if err := writeKey(o.To, key); err != nil {
		return err
	}
	o.Printer.Success(fmt.Sprintf("Wrote the backup repository key to %s (mode 0600): a recovery cluster needs it in Secret %s/%s before its first restore of volume data", o.To, components.VeleroNamespace, RepositoryKeySecret))
	return nil
}

// ExportSSEKey writes the SSE-C key of the backup location to o.To: the file the location's
// customerKeyEncryptionFile names, read from the Secret mounted there in the Velero pod.
func ExportSSEKey(ctx context.Context, o *ExportOptions) error {
	e, err := load(ctx, &o.Options)
	if err != nil {
		return err
	}
	bsl, err := kube.GetAs[velerov1.BackupStorageLocation](ctx, e.cl.Dynamic, bslGVR, components.VeleroNamespace, components.BackupLocation)
	if err != nil {
		return veleroErr("read the backup storage location", err)
	}
	file := bsl.Spec.Config[sseKeyConfig]
	if file == "" {
		return fmt.Errorf("backups on this cluster are not encrypted with an SSE-C key (backup storage location %s sets no %s): there is no key to export", components.BackupLocation, sseKeyConfig)
	}
	dep, err := e.cl.Kube.AppsV1().Deployments(components.VeleroNamespace).Get(ctx, components.VeleroDeployment, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the Velero Deployment: %w", err)
	}
	secret, field, err := mountedSecret(&dep.Spec.Template.Spec, file)
	if err != nil {
		return err
	}
	key, err := e.secretValue(ctx, secret, field)
	if err != nil {
		return err
	}
	if err := writeKey(o.To, key); err != nil {
		return err
	}
	o.Printer.Success(fmt.Sprintf("Wrote the SSE-C key to %s (mode 0600): without it no object of this cluster's backups can be read", o.To))
	return nil
}

// mountedSecret finds the Secret and key that the Velero container sees at file.
func mountedSecret(pod *corev1.PodSpec, file string) (secret, field string, err error) {
	volumes := map[string]*corev1.SecretVolumeSource{}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			volumes[v.Name] = v.Secret
		}
	}
	for _, c := range pod.Containers {
		if c.Name != components.VeleroDeployment {
			continue
		}
		for _, m := range c.VolumeMounts {
			src := volumes[m.Name]
			rel, ok := strings.CutPrefix(path.Clean(file), path.Clean(m.MountPath)+"/")
			if src == nil || !ok {
				continue
			}
			if m.SubPath != "" {
				rel = path.Join(m.SubPath, rel)
			}
			for _, item := range src.Items {
				if item.Path == rel {
					return src.SecretName, item.Key, nil
				}
			}
			return src.SecretName, rel, nil
		}
	}
	return "", "", fmt.Errorf("the backup location's SSE-C key file %s is not mounted from a Secret in the Velero container: kip cannot read it", file)
}

func (e *env) secretValue(ctx context.Context, name, field string) ([]byte, error) {
	s, err := e.cl.Kube.CoreV1().Secrets(components.VeleroNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	v, ok := s.Data[field]
	if !ok || len(v) == 0 {
		return nil, fmt.Errorf("Secret %s/%s has no %s", components.VeleroNamespace, name, field)
	}
	return v, nil
}

// writeKey writes key to a new file at path, mode 0600, and never over an existing one.
func writeKey(file string, key []byte) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s exists: kip never overwrites a key file (an older key may still be needed for older backups); choose another --to or move that file away", file)
	}
	if err != nil {
		return fmt.Errorf("write key: %w", err)
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		os.Remove(file)
		return fmt.Errorf("write key to %s: %w", file, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(file)
		return fmt.Errorf("write key to %s: %w", file, err)
	}
	return f.Close()
}
