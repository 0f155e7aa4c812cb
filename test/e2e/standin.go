package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/helmstandin"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/longhorn-standin/manager"
	"kipper.run/kip/test/longhorn-standin/standin"
	"kipper.run/kip/test/testenv"
)

// InstallStandin installs the k3s stand-in on h the way k3s's installer lays k3s out: the binary,
// read from the airgap bundle and verified against its checksum file, at /usr/local/bin/k3s, config at /etc/rancher/k3s/config.yaml, and kip's unit for k3s (server)
// or k3s-agent (agent), enabled and started. It returns once systemd reports the unit started,
// which for Type=notify means the stand-in said READY=1. (kip's own install puts k3s there
// through its airgap path; this is for tests of the lab itself.)
func (s *Suite) InstallStandin(ctx context.Context, h *lab.Host, role, config string) error {
	unit, unitFile, err := k3s.Unit(role)
	if err != nil {
		return err
	}
	bin, err := k3s.LoadBundle(s.Bundle, "x86_64") // lab hosts share this machine's architecture
	if err != nil {
		return err
	}
	err = Upload(ctx, h, map[string]File{
		k3s.BinaryPath:                 {bin.Data, 0o755},
		"/etc/rancher/k3s/config.yaml": {[]byte(config), 0o600},
		k3s.UnitPath(unit):             {unitFile, 0o644},
	})
	if err != nil {
		return err
	}
	_, err = h.Run(ctx, "systemctl daemon-reload && "+sshx.Command("systemctl", "enable", "--now", unit))
	if err != nil {
		journal, _ := h.Run(ctx, sshx.Command("journalctl", "-u", unit, "-n", "40", "--no-pager"))
		return fmt.Errorf("start %s on %s: %w\n%s", unit, h.Name, err, journal)
	}
	return nil
}

// File is a file's content and mode, for Upload.
type File struct {
	Data []byte
	Mode os.FileMode
}

// Upload writes files (by path) on h as root, creating their directories, over one SSH
// connection with sshx's atomic upload.
func Upload(ctx context.Context, h *lab.Host, files map[string]File) error {
	c, err := sshx.Dial(ctx, h.SSHConfig(h.PrivateIP))
	if err != nil {
		return err
	}
	defer c.Close()
	for path, f := range files {
		if _, err := h.Run(ctx, sshx.Command("mkdir", "-p", filepath.Dir(path))); err != nil {
			return err
		}
		if err := c.Upload(ctx, path, f.Data, f.Mode, "root"); err != nil {
			return err
		}
	}
	return nil
}

// Kubeconfig fetches the server's /etc/rancher/k3s/k3s.yaml, points it at the server's private
// address as kip does, and writes it 0600 into a test directory.
func (s *Suite) Kubeconfig(ctx context.Context, t testing.TB, server *lab.Host) string {
	t.Helper()
	kc, err := server.Run(ctx, "cat /etc/rancher/k3s/k3s.yaml")
	if err != nil {
		t.Fatalf("read the kubeconfig on %s: %v", server.Name, err)
	}
	kc = strings.ReplaceAll(kc, "https://127.0.0.1:6443", "https://"+server.PrivateIP.String()+":6443")
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ServerConfig is a stand-in server's k3s configuration on h: its private and public addresses as
// its node's, and a kubeconfig only root reads.
func ServerConfig(h *lab.Host) string {
	return fmt.Sprintf("node-ip: %s\nnode-external-ip: %s\nwrite-kubeconfig-mode: \"0600\"\n", h.PrivateIP, h.PublicIP)
}

// Clients are clients of server's cluster, through the kubeconfig it returns too, once the nodes
// named are Ready.
func (s *Suite) Clients(ctx context.Context, t testing.TB, server *lab.Host, nodes ...string) (string, *rest.Config, *kube.Clients) {
	t.Helper()
	kubeconfig := s.Kubeconfig(ctx, t, server)
	cfg, err := kube.LoadConfig(kubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := kube.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitNodesReady(ctx, c, nodes, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, cfg, c
}

// ChartFixturesDir is where the k3s stand-in's helm-controller looks for what a chart would
// create (see docs/k3s-standin.md): <dir>/<chart name>/*.yaml.
const ChartFixturesDir = "/var/lib/rancher/k3s/server/standin-charts"

// longhornClass is Longhorn's stock class, which its chart marks as the default class.
const longhornClass = `---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: longhorn
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: driver.longhorn.io
allowVolumeExpansion: true
reclaimPolicy: Delete
volumeBindingMode: Immediate
parameters:
  numberOfReplicas: "3"
`

// zotFixture stands in for Zot's chart: its Deployment, of test/images' Zot stand-in (an HTTP
// server answering the registry API's version check), and its Service on the node port every
// node's containerd pulls through, as kip's values for the chart set it.
const zotFixture = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: zot
spec:
  replicas: 1
  selector:
    matchLabels: {app.kubernetes.io/name: zot, app.kubernetes.io/instance: zot}
  template:
    metadata:
      labels: {app.kubernetes.io/name: zot, app.kubernetes.io/instance: zot}
    spec:
      containers:
        - name: zot
          image: ghcr.io/project-zot/zot-linux-amd64:v2.1.18
          ports: [{name: zot, containerPort: 5000}]
          readinessProbe:
            httpGet: {path: /v2/, port: 5000}
---
apiVersion: v1
kind: Service
metadata:
  name: zot
spec:
  type: NodePort
  selector: {app.kubernetes.io/name: zot, app.kubernetes.io/instance: zot}
  ports: [{name: zot, port: 5000, targetPort: 5000, nodePort: 30500}]
`

// longhornNode is the Longhorn Node of server h, which Longhorn's manager (its chart's DaemonSet)
// makes as it starts there, without disks: the Longhorn stand-in, once a test installs it on h,
// gives it its default disk, as the manager does.
func longhornNode(h *lab.Host) string {
	return fmt.Sprintf(`---
apiVersion: longhorn.io/v1beta2
kind: Node
metadata:
  name: %s
spec:
  name: %s
  allowScheduling: true
`, h.Name, h.Name)
}

// UploadChartFixtures puts on h what the charts kip installs would create that kip relies on,
// for the stand-in's helm-controller to apply when kip installs each HelmChart: cert-manager's
// ClusterIssuer CRD, Longhorn's CRDs (from the longhorn-manager module), its class and the
// server's Longhorn Node, and Zot's registry.
func UploadChartFixtures(ctx context.Context, h *lab.Host) error {
	crds, err := testenv.LonghornCRDs()
	if err != nil {
		return err
	}
	return Upload(ctx, h, map[string]File{
		ChartFixturesDir + "/cert-manager/crds.yaml": {Data: []byte(helmstandin.CertManagerFixture), Mode: 0o644},
		ChartFixturesDir + "/longhorn/longhorn.yaml": {Data: append(append(crds, longhornClass...), longhornNode(h)...), Mode: 0o644},
		ChartFixturesDir + "/zot/zot.yaml":           {Data: []byte(zotFixture), Mode: 0o644},
	})
}

// UploadLonghornReleases puts on h the fixtures of Longhorn's chart at each release the
// Longhorn stand-in models (standin.ReleaseChart: the release's CRDs and the longhorn-manager
// DaemonSet running the stand-in's manager), with its class and the server's Longhorn Node, for
// the stand-in's helm-controller to apply when the chart moves to that version; and imports the
// stand-in's images (standin.WriteImages) into h's containerd, which those pods run.
func UploadLonghornReleases(ctx context.Context, h *lab.Host) error {
	files := map[string]File{}
	for _, r := range manager.Releases {
		chart, err := standin.ReleaseChart(r.Version)
		if err != nil {
			return err
		}
		files[ChartFixturesDir+"/longhorn/"+standin.ChartVersion(r.Version)+"/longhorn.yaml"] = File{Data: append(append(chart, longhornClass...), longhornNode(h)...), Mode: 0o644}
	}
	if err := Upload(ctx, h, files); err != nil {
		return err
	}
	const archive = "/var/tmp/longhorn-standin-images.tar"
	if err := standin.WriteImages(ctx, h.Path(archive)); err != nil {
		return err
	}
	if out, err := h.Run(ctx, Ctr("images", "import", archive)); err != nil {
		return fmt.Errorf("import the Longhorn stand-in's images on %s: %w\n%s", h.Name, err, out)
	}
	return nil
}

// Ctr is a command line of containerd's ctr on a lab host's kubelet's containerd.
func Ctr(args ...string) string {
	return sshx.Command(StandinBinDir+"/ctr", append([]string{"--address", "/run/k3s/containerd/containerd.sock", "-n", "k8s.io"}, args...)...)
}

// ImportVeleroImages imports Velero's container images (VeleroDir/images) into h's containerd,
// as an operator imports images with k3s ctr: only the hosts that run Velero's pods need them.
func ImportVeleroImages(ctx context.Context, h *lab.Host) error {
	for _, image := range []string{"velero.tar", "velero-plugin-for-aws.tar"} {
		if out, err := h.Run(ctx, Ctr("images", "import", VeleroDir+"/images/"+image)); err != nil {
			return fmt.Errorf("import %s on %s: %w\n%s", image, h.Name, err, out)
		}
	}
	return nil
}

// ImportPostgresImage imports the lab's PostgreSQL image (PostgresDir/images/postgres.tar,
// PostgresImage) into h's containerd, as an operator imports images with k3s ctr: only the hosts
// that run a Postgres pod need it.
func ImportPostgresImage(ctx context.Context, h *lab.Host) error {
	if out, err := h.Run(ctx, Ctr("images", "import", PostgresDir+"/images/postgres.tar")); err != nil {
		return fmt.Errorf("import %s on %s: %w\n%s", PostgresImage, h.Name, err, out)
	}
	return nil
}

// LogK3sOnFailure has t log the last lines of k3s's journal on h (and of k3s-agent's) when t
// fails, before the lab goes: why a k3s start failed is there.
func LogK3sOnFailure(t testing.TB, h *lab.Host) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := h.Run(ctx, "systemctl status k3s k3s-agent --no-pager -n 0; journalctl -u k3s -u k3s-agent --no-pager -o cat -n 120 | grep -v ' I[0-9]'")
		t.Logf("k3s on %s (%v):\n%s", h.Name, err, out)
	})
}
