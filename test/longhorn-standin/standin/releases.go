package standin

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kipper.run/kip/test/longhorn-standin/manager"
)

// ManagerServiceAccount is the service account of Longhorn's manager and instance managers, as
// its chart names it.
const ManagerServiceAccount = "longhorn-service-account"

// WriteImages writes to path an image archive (docker's format, which ctr images import reads)
// of one image holding the stand-in (Build), under the references of every release's
// longhorn-manager and longhorn-instance-manager images: the manager's pods run its manager
// (their arguments say so), an instance manager's pods its instance-manager, which only waits.
func WriteImages(ctx context.Context, path string) error {
	bin, err := Build(ctx)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "longhorn-standin", Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Config.Entrypoint, cfg.Config.Cmd = []string{"/longhorn-standin"}, []string{"instance-manager"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	refs := map[name.Reference]v1.Image{}
	for _, r := range manager.Releases {
		for _, ref := range []string{r.ManagerImage(), r.InstanceManagerImage()} {
			tag, err := name.NewTag(ref)
			if err != nil {
				return err
			}
			refs[tag] = img
		}
	}
	return tarball.MultiRefWriteToFile(path, refs)
}

// ReleaseChart is what Longhorn's chart of release (one of manager.Releases) installs that the
// stand-in models: the release's CRDs (ReleaseCRDs), the manager's service account (bound to
// cluster-admin: Longhorn's own role is nearly as wide), and the longhorn-manager DaemonSet,
// whose pods run the stand-in's manager of release (longhorn-standin manager), as a helm stand-in
// fixture (test/helmstandin) for the chart at that version. Longhorn's CSI workloads are not
// among it: the stand-in's plugin and sidecars run under systemd (Install).
func ReleaseChart(release string) ([]byte, error) {
	r, err := manager.Find(release)
	if err != nil {
		return nil, err
	}
	crds, err := ReleaseCRDs(release)
	if err != nil {
		return nil, err
	}
	rest := strings.NewReplacer("SA", ManagerServiceAccount, "NS", Namespace, "IMAGE", r.ManagerImage(), "VERSION", r.Version).Replace(`---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: SA
  namespace: NS
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: longhorn-standin-manager
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: SA, namespace: NS}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: longhorn-manager
  namespace: NS
  labels: {app: longhorn-manager}
spec:
  selector:
    matchLabels: {app: longhorn-manager}
  template:
    metadata:
      labels: {app: longhorn-manager}
    spec:
      serviceAccountName: SA
      containers:
        - name: longhorn-manager
          image: IMAGE
          imagePullPolicy: IfNotPresent
          args: [manager, -node=$(NODE_NAME), -version=VERSION, -service-account=SA]
          env:
            - name: NODE_NAME
              valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
`)
	return append(crds, rest...), nil
}

// ChartVersion is the chart version of release, as a HelmChart names it and the helm stand-in
// finds its fixtures by: 1.8.2.
func ChartVersion(release string) string { return strings.TrimPrefix(release, "v") }
