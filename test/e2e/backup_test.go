package e2e_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/testenv"
	velerotest "kipper.run/kip/test/velero"
)

// backupHost is the backup test's host (index 6, lab7).
const backupHost = 6

// payloadScript is the service's container: on an empty volume it writes 4 MiB of random bytes
// owned by 2000:2000 with mode 640, then, every start, prints the file's checksum, owner and
// mode ("payload <sha256> <uid> <gid> <mode>") and sleeps.
const payloadScript = `if [ ! -f /data/payload ]; then head -c 4194304 /dev/urandom > /data/payload && chown 2000:2000 /data/payload && chmod 640 /data/payload; fi
echo "payload $(sha256sum /data/payload | cut -d' ' -f1) $(stat -c '%u %g %a' /data/payload)"
exec sleep 1000000`

var payloadLine = regexp.MustCompile(`payload [0-9a-f]{64} \d+ \d+ \d+`)

// TestBackupOfRealVolumes backs a service's volume up with Velero running as its chart runs it —
// the server as a Deployment, the node agent as a DaemonSet, on a real kubelet and containerd —
// into gofakes3 on the lab's gateway, through the real kip binary: kip backup create --wait
// reports a completed backup whose file-system backup holds the volume's bytes; after the
// namespace is lost, kip backup restore brings the file back with its checksum, owner and mode;
// kip backup drill restores it beside the original and removes the copy.
func TestBackupOfRealVolumes(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	h := s.Own(t, backupHost)[0]
	e2e.LogK3sOnFailure(t, h)
	if err := s.InstallStandin(ctx, h, "server", e2e.ServerConfig(h)); err != nil {
		t.Fatal(err)
	}
	kubeconfig, restCfg, c := s.Clients(ctx, t, h, h.Name)
	if err := e2e.ImportVeleroImages(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InstallVeleroCRDs(ctx, c.APIExt); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	v := velerotest.StartInCluster(t, restCfg, lab.Gateway)
	t.Logf("measured: Velero's server and node agent running in the lab %s after their objects were created", time.Since(start).Round(100*time.Millisecond))
	// kip's record, as kip install writes it for external backup storage.
	if _, err := cluster.UpdateRecord(ctx, c.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server = "small", cluster.StorageLocal, h.PublicIP.String()
		rec.Backups, rec.BackupLocation = cluster.BackupsExternal, &cluster.BackupLocation{Bucket: v.Bucket, Endpoint: v.S3URL}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	const ns = "shop-prod"
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := createPayloadService(ctx, c, ns); err != nil {
		t.Fatal(err)
	}
	original := payload(ctx, t, c, ns)
	t.Logf("the service's volume: %s", original)

	home := s.Home(t)
	start = time.Now()
	r := s.Kip(t, home, "--kubeconfig", kubeconfig, "backup", "create", "--namespace", ns, "--wait")
	if r.ExitCode != 0 {
		t.Fatalf("kip backup create --wait: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("measured: kip backup create --namespace %s --wait (one 4 MiB volume, file-system backup through the node agent) took %s", ns, time.Since(start).Round(100*time.Millisecond))
	name := regexp.MustCompile(`Started backup (\S+)`).FindStringSubmatch(r.Stderr)
	if name == nil {
		t.Fatalf("kip named no backup:\n%s", r.Stderr)
	}
	r = s.Kip(t, home, "--kubeconfig", kubeconfig, "backup", "describe", name[1], "-o", "json")
	var d backup.Description
	if err := json.Unmarshal([]byte(r.Stdout), &d); r.ExitCode != 0 || err != nil {
		t.Fatalf("kip backup describe -o json: exit %d, %v\n%s%s", r.ExitCode, err, r.Stdout, r.Stderr)
	}
	if d.Verdict.State != backup.StateCompleted || len(d.ByNamespace) != 1 || len(d.ByNamespace[0].Volumes) != 1 {
		t.Fatalf("describe: %+v", d)
	}
	if vol := d.ByNamespace[0].Volumes[0]; vol.Claim != "data" || vol.Phase != "Completed" || vol.Bytes < 4<<20 {
		t.Errorf("the volume's file-system backup: %+v; want claim data Completed with at least 4 MiB", vol)
	}
	if objs := v.Objects(t, "kopia/"+ns+"/"); len(objs) == 0 {
		t.Errorf("no Kopia repository for %s in the bucket", ns)
	}

	// The namespace is lost with its volume: deleting the claim deletes its directory.
	if err := c.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.PollPending(ctx, 3*time.Minute, "namespace "+ns+" gone", func(ctx context.Context) (string, error) {
		_, err := c.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "terminating", err
	}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	r = s.Kip(t, home, "--kubeconfig", kubeconfig, "backup", "restore", name[1])
	if r.ExitCode != 0 {
		t.Fatalf("kip backup restore: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if err := kube.WaitRollout(ctx, c, "Deployment", ns, "db", 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: kip backup restore to the service Ready again took %s", time.Since(start).Round(100*time.Millisecond))
	if got := payload(ctx, t, c, ns); got != original {
		t.Fatalf("restored volume: %s, want %s", got, original)
	}

	// Restoring over the service that is back is refused off a terminal without --yes: it
	// would skip every object.
	r = s.Kip(t, home, "--kubeconfig", kubeconfig, "backup", "restore", name[1])
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "namespace "+ns+" still holds objects") {
		t.Errorf("restore over the restored service: exit %d\n%s", r.ExitCode, r.Stderr)
	}

	start = time.Now()
	r = s.Kip(t, home, "--kubeconfig", kubeconfig, "backup", "drill", ns)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "1 workloads Ready (deployment db)") || !strings.Contains(r.Stderr, "Removed the drill's copy "+ns+"-drill") {
		t.Fatalf("kip backup drill: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("measured: kip backup drill %s took %s", ns, time.Since(start).Round(100*time.Millisecond))

	// A pod that cannot start (its image does not exist) is Pending on a real kubelet: Velero
	// skips its volume with a warning and calls the backup Completed; kip does not.
	stuck := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "stuck", Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
		StorageClassName: ptr.To("local-path"), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}}}}
	if _, err := c.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, stuck, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Placed by the scheduler (not by nodeName), so that the local-path provisioner binds its claim.
	pod := podOn("stuck", "", "true")
	pod.Namespace = ns
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: h.Name}
	pod.Spec.Containers[0].Image = "registry.invalid/kip/no-such-image:1"
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "stuck"}}}}
	if _, err := c.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, 2*time.Minute, "claim stuck bound", func(ctx context.Context) (bool, string, error) {
		got, err := c.Kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "stuck", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.ClaimBound, "not bound yet", err
	}); err != nil {
		t.Fatal(err)
	}
	r = s.Kip(t, home, "--kubeconfig", kubeconfig, "backup", "create", "--namespace", ns, "--wait")
	want := "it holds no data for volume " + ns + "/stuck"
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "pod "+ns+"/stuck (Pending) mounts claim stuck") || !strings.Contains(r.Stderr, want) {
		t.Fatalf("kip backup create with a Pending pod: exit %d, want 1, a warning and %q\n%s", r.ExitCode, want, r.Stderr)
	}
	name = regexp.MustCompile(`Started backup (\S+)`).FindStringSubmatch(r.Stderr)
	got, err := kube.GetAs[velerov1.Backup](ctx, c.Dynamic, velerotest.BackupResource, velerotest.Namespace, name[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Velero on a Pending pod's volume: phase %s, %d errors, %d warnings", got.Status.Phase, got.Status.Errors, got.Status.Warnings)
	if got.Status.Phase != velerov1.BackupPhaseCompleted || got.Status.Errors != 0 {
		t.Errorf("Velero's verdict: phase %s, %d errors; the case kip guards against is Completed with none", got.Status.Phase, got.Status.Errors)
	}
}

// createPayloadService creates the service: a local-path claim and a Deployment whose pod writes
// and reports its payload.
func createPayloadService(ctx context.Context, c *kube.Clients, ns string) error {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
		StorageClassName: ptr.To("local-path"), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}}
	if _, err := c.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		return err
	}
	labels := map[string]string{"app": "db"}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "db", Image: busybox, Command: []string{"sh", "-c", payloadScript},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		}}}}
	if _, err := c.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return err
	}
	return kube.WaitRollout(ctx, c, "Deployment", ns, "db", 3*time.Minute)
}

// payload is the line the service's running pod printed about its volume.
func payload(ctx context.Context, t *testing.T, c *kube.Clients, ns string) string {
	t.Helper()
	var line string
	err := poll(ctx, time.Minute, "the service's payload line", func(ctx context.Context) (bool, error) {
		pods, err := c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=db"})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			raw, err := c.Kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: "db"}).DoRaw(ctx)
			if err != nil {
				return false, nil
			}
			if line = payloadLine.FindString(string(raw)); line != "" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return line
}
