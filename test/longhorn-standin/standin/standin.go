// Package standin installs the lab's Longhorn stand-in (test/longhorn-standin,
// docs/longhorn-standin.md) on a lab host that runs the k3s stand-in's server: the plugin and
// the CSI sidecars (tools/testenv.sh csi) as systemd units on the host, Longhorn's stock StorageClass and
// the CSIDriver object. Tests then make claims of class longhorn as on a cluster with Longhorn.
package standin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/longhorn-standin/loop"
	"kipper.run/kip/test/testenv"
)

const (
	// Class is Longhorn's stock StorageClass.
	Class = "longhorn"
	// Driver is Longhorn's CSI driver.
	Driver = "driver.longhorn.io"
	// Namespace is Longhorn's namespace, where its objects are.
	Namespace = "longhorn-system"
	// Dir is where the stand-in's binaries and Longhorn's CRDs are on the host.
	Dir = "/usr/local/lib/longhorn-standin"
	// DataPath is Longhorn's data path on the host: the data of a volume's copy there is
	// DataPath/replicas/<volume>-<8 hex digits>/volume.img.
	DataPath = "/var/lib/longhorn"
	// Unit is the plugin's systemd unit; each sidecar's is Unit's name with its own
	// (longhorn-standin-csi-provisioner.service, …), bound to it.
	Unit = "longhorn-standin.service"
)

// sidecars are the CSI sidecars the stand-in runs, with their flags beyond the socket and the
// kubeconfig: one instance each, so no leader election.
var sidecars = []struct{ name, flags string }{
	{"csi-provisioner", "--timeout=2m --default-fstype=ext4 --extra-create-metadata=true"},
	{"csi-attacher", "--timeout=2m"},
	{"csi-resizer", "--timeout=2m"},
}

// Image returns where the data of a volume's copy on h is, as this machine sees it (a host holds
// one copy of a volume at most); with no copy there, a path that does not exist.
func Image(h *lab.Host, volume string) string {
	pattern := images(h, volume)
	if m, _ := filepath.Glob(pattern); len(m) == 1 {
		return m[0]
	}
	return pattern
}

// images is the glob pattern of the images of volume's copies on h; volume may be a pattern too.
func images(h *lab.Host, volume string) string {
	return h.Path(filepath.Join(DataPath, "replicas", volume+"-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]", "volume.img"))
}

// Install builds the plugin from this checkout, puts it and the CSI sidecars (bin/csi, from
// tools/testenv.sh csi) on h with Longhorn's CRDs (from the longhorn-manager module), starts them under
// systemd, and creates the StorageClass longhorn and the CSIDriver. It returns once the kubelet
// on h has registered the driver and the plugin has made Longhorn's Node for h. c is a client of
// h's cluster; h runs its server.
func Install(ctx context.Context, h *lab.Host, c *kube.Clients) error {
	return install(ctx, h, c, nil)
}

// InstallNode runs the plugin alone on h, a worker of c's cluster whose server runs Install's
// sidecars: as Longhorn's node plugin on a worker, it registers the driver with h's kubelet and
// makes Longhorn's Node for h. kubeconfig reaches the cluster's API from h (a worker has no
// k3s.yaml); it is written 0600 beside the plugin.
func InstallNode(ctx context.Context, h *lab.Host, c *kube.Clients, kubeconfig []byte) error {
	return install(ctx, h, c, kubeconfig)
}

// Build builds the stand-in (static) from this checkout into bin/longhorn-standin and returns
// its path.
func Build(ctx context.Context) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	plugin := filepath.Join(root, "bin", "longhorn-standin")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", plugin, "./test/longhorn-standin")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the Longhorn stand-in: %v\n%s", err, out)
	}
	return plugin, nil
}

func install(ctx context.Context, h *lab.Host, c *kube.Clients, kubeconfig []byte) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	csiDir, err := filepath.EvalSymlinks(filepath.Join(root, "bin", "csi"))
	if err != nil {
		return fmt.Errorf("the CSI sidecars are not built: run make testenv (sh tools/testenv.sh csi): %w", err)
	}
	plugin, err := Build(ctx)
	if err != nil {
		return err
	}
	crds, err := testenv.LonghornCRDs()
	if err != nil {
		return err
	}
	files := map[string]string{"longhorn-standin": plugin}
	if kubeconfig == nil {
		for _, s := range sidecars {
			files[s.name] = filepath.Join(csiDir, s.name)
		}
	}
	if err := os.MkdirAll(h.Path(Dir), 0o755); err != nil {
		return err
	}
	for name, src := range files {
		if err := copyFile(src, h.Path(filepath.Join(Dir, name)), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(h.Path(filepath.Join(Dir, "crds.yaml")), crds, 0o644); err != nil {
		return err
	}
	kubeconfigPath := "/etc/rancher/k3s/k3s.yaml"
	if kubeconfig != nil {
		kubeconfigPath = Dir + "/kubeconfig"
		if err := os.WriteFile(h.Path(kubeconfigPath), kubeconfig, 0o600); err != nil {
			return err
		}
	}
	units := []string{Unit}
	if err := writeUnit(h, Unit, pluginUnit(h.Name, kubeconfigPath, kubeconfig != nil)); err != nil {
		return err
	}
	if kubeconfig == nil {
		for _, s := range sidecars {
			name := "longhorn-standin-" + s.name + ".service"
			units = append(units, name)
			if err := writeUnit(h, name, sidecarUnit(s.name, s.flags)); err != nil {
				return err
			}
		}
		if err := createObjects(ctx, c); err != nil {
			return err
		}
	}
	if _, err := h.Run(ctx, "systemctl daemon-reload && "+sshx.Command("systemctl", append([]string{"enable", "--now"}, units...)...)); err != nil {
		return fmt.Errorf("start the Longhorn stand-in on %s: %w\n%s", h.Name, err, Journal(ctx, h))
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.Kube.StorageV1().CSINodes().Get(ctx, h.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // the kubelet makes it
		}
		registered := false
		for _, d := range n.Spec.Drivers {
			registered = registered || d.Name == Driver
		}
		if !registered {
			return false, nil
		}
		_, err = c.Longhorn.LonghornV1beta2().Nodes(Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the Longhorn stand-in on %s: driver not registered with the kubelet, or no Longhorn node: %w\n%s", h.Name, err, Journal(ctx, h))
	}
	return nil
}

// pluginUnit is the plugin's unit. On a worker it runs only while k3s-agent runs, as Longhorn's
// node plugin is a pod there: started with it, stopped with it (and so by kip node fence, which
// stops k3s-agent and every container), and not started while its start is skipped (a fenced
// worker's drop-in), also at boot.
func pluginUnit(node, kubeconfig string, worker bool) string {
	deps, wantedBy, flags := "After=k3s.service\nWants=k3s.service", "multi-user.target", " -controller"
	if worker {
		deps, wantedBy, flags = "After=k3s-agent.service\nBindsTo=k3s-agent.service", "k3s-agent.service", ""
	}
	// It never stops trying, as the pod of Longhorn's plugin restarts for as long as its
	// DaemonSet runs: it ends when it cannot reach the API server at its start, which a
	// restart of k3s makes it unable to for a while.
	return fmt.Sprintf(`[Unit]
Description=The lab's Longhorn stand-in: CSI plugin for %[1]s (test only)
%[5]s
StartLimitIntervalSec=0

[Service]
ExecStart=%[2]s/longhorn-standin -node %[3]s%[7]s -kubeconfig %[4]s -crds %[2]s/crds.yaml
# Its volumes' file systems are unmounted and their loop devices detached when it stops.
ExecStopPost=%[2]s/longhorn-standin cleanup
Restart=on-failure
RestartSec=2

[Install]
WantedBy=%[6]s
`, Driver, Dir, node, kubeconfig, deps, wantedBy, flags)
}

func sidecarUnit(name, flags string) string {
	return fmt.Sprintf(`[Unit]
Description=The lab's Longhorn stand-in: %[1]s (test only)
After=%[2]s
BindsTo=%[2]s

[Service]
ExecStart=%[3]s/%[1]s --csi-address=/var/lib/kubelet/plugins/%[4]s/csi.sock --kubeconfig=/etc/rancher/k3s/k3s.yaml --leader-election=false %[5]s
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
`, name, Unit, Dir, Driver, flags)
}

func writeUnit(h *lab.Host, name, content string) error {
	return os.WriteFile(h.Path("/etc/systemd/system/"+name), []byte(content), 0o644)
}

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// createObjects creates Longhorn's stock StorageClass (not marked default: k3s's local-path is)
// and the CSIDriver Longhorn's manager deploys.
func createObjects(ctx context.Context, c *kube.Clients) error {
	class := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: Class},
		Provisioner:          Driver,
		AllowVolumeExpansion: ptr.To(true),
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingImmediate),
		Parameters:           map[string]string{"numberOfReplicas": "3", "staleReplicaTimeout": "30", "fromBackup": "", "fsType": "ext4", "dataLocality": "disabled"},
	}
	if _, err := c.Kube.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	driver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: Driver}, Spec: storagev1.CSIDriverSpec{
		AttachRequired: ptr.To(true), PodInfoOnMount: ptr.To(true),
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
	}}
	if _, err := c.Kube.StorageV1().CSIDrivers().Create(ctx, driver, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// Claim is a ReadWriteOnce claim of class longhorn for size.
func Claim(name, namespace, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: corev1.PersistentVolumeClaimSpec{
		StorageClassName: ptr.To(Class), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
}

// CreateClaim creates a claim of class longhorn and waits until it is bound, returning its
// volume's name (the PV's, the Longhorn Volume's).
func CreateClaim(ctx context.Context, c *kube.Clients, name, namespace, size string) (string, error) {
	return CreateClaimOf(ctx, c, Claim(name, namespace, size))
}

// CreateClaimOf creates pvc and waits until it is bound, returning its volume's name.
func CreateClaimOf(ctx context.Context, c *kube.Clients, pvc *corev1.PersistentVolumeClaim) (string, error) {
	namespace, name := pvc.Namespace, pvc.Name
	if _, err := c.Kube.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	var volume string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvc, err := c.Kube.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		volume = pvc.Spec.VolumeName
		return pvc.Status.Phase == corev1.ClaimBound, nil
	})
	if err != nil {
		return "", fmt.Errorf("claim %s/%s not bound: %w", namespace, name, err)
	}
	return volume, nil
}

// Uninstall stops the stand-in on h (its volumes' file systems unmounted and loop devices
// detached as it stops), then detaches from this machine any loop device still bound to a volume
// image on h, as when h died before its plugin could: it returns those it had to detach.
func Uninstall(ctx context.Context, h *lab.Host) ([]string, error) {
	var errs []string
	if _, err := os.Stat(h.Path("/etc/systemd/system/" + Unit)); err == nil && h.Running() {
		if out, err := h.Run(ctx, sshx.Command("systemctl", "stop", Unit)); err != nil {
			errs = append(errs, fmt.Sprintf("stop %s: %v: %s", Unit, err, out))
		}
	}
	files, _ := filepath.Glob(images(h, "*"))
	detached, err := loop.DetachFiles(files...)
	if err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return detached, fmt.Errorf("uninstall the Longhorn stand-in on %s: %s", h.Name, strings.Join(errs, "; "))
	}
	return detached, nil
}

// Journal is the last lines of the stand-in's units' journal on h.
func Journal(ctx context.Context, h *lab.Host) string {
	out, err := h.Run(ctx, "journalctl -u 'longhorn-standin*' --no-pager -o cat -n 80")
	if err != nil {
		return fmt.Sprintf("journal of the Longhorn stand-in on %s: %v", h.Name, err)
	}
	return out
}

// LogOnFailure has t log the stand-in's journal on h when t fails.
func LogOnFailure(t testing.TB, h *lab.Host) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t.Logf("the Longhorn stand-in on %s:\n%s", h.Name, Journal(ctx, h))
	})
}
