package e2e_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/e2e"
)

// olderLonghorn is the Longhorn release the lab cluster is set back to before its upgrade: a
// plain kip upgrade keeps it.
const olderLonghorn = "1.10.2"

// upgradeOnLab upgrades TestInstallLonghorn's cluster with kip upgrade, on real kubelets and
// containers:
//   - console-api on an image that cannot be pulled (--image-tag of a commit the registry does
//     not have): the kubelet backs off pulling it while the old pod keeps serving, and the
//     upgrade stops at once naming the new pod and the reason;
//   - then kip upgrade --yes resumes and finishes: console-api back on its released image with
//     its hardening and the volume added by hand, both console Deployments serving alone on
//     their new pods, Dex's configuration byte-identical, Longhorn left at the older release the
//     cluster runs, the cluster record naming this kip.
func upgradeOnLab(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients) {
	t.Helper()
	deployments := c.Kube.AppsV1().Deployments("kipper-system")
	// A volume an operator added to console-api by hand.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := deployments.Get(ctx, "console-api", metav1.GetOptions{})
		if err != nil {
			return err
		}
		d.Spec.Template.Spec.Volumes = append(d.Spec.Template.Spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		ct := &d.Spec.Template.Spec.Containers[0]
		ct.VolumeMounts = append(ct.VolumeMounts, corev1.VolumeMount{Name: "extra", MountPath: "/extra"})
		_, err = deployments.Update(ctx, d, metav1.UpdateOptions{FieldManager: "kubectl-edit"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitServingAlone(ctx, c, "kipper-system", "console-api", 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	// The cluster runs an older Longhorn, as one installed by an earlier kip does.
	if _, err := c.Dynamic.Resource(components.HelmCharts).Namespace(components.HelmChartNamespace).Patch(ctx, "longhorn", types.MergePatchType,
		[]byte(`{"spec":{"version":"`+olderLonghorn+`"}}`), metav1.PatchOptions{FieldManager: "earlier-kip"}); err != nil {
		t.Fatal(err)
	}
	dex := dexConfig(ctx, t, c)

	// An image that cannot start: the upgrade stops naming the pod, and the old one serves.
	r := s.Kip(t, home, "upgrade", "--skip-system", "--image-tag", strings.Repeat("0", 40))
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "Deployment kipper-system/console-api's new pod console-api-") ||
		!strings.Contains(r.Stderr, "cannot start: container console-api is in ImagePullBackOff") ||
		!strings.Contains(r.Stderr, "run kip upgrade again to go on") {
		t.Fatalf("kip upgrade on an image that cannot be pulled: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("kip upgrade --skip-system --image-tag 000…:\n%s", r.Stderr)
	pods, err := c.Kube.CoreV1().Pods("kipper-system").List(ctx, metav1.ListOptions{LabelSelector: "app=console-api"})
	if err != nil {
		t.Fatal(err)
	}
	serving := slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool {
		return strings.HasSuffix(p.Spec.Containers[0].Image, ":latest") && p.Status.Phase == corev1.PodRunning && podReady(&p)
	})
	if !serving {
		t.Error("no console-api pod of the released image served while the new one could not start")
	}

	start := time.Now()
	r = s.Kip(t, home, "upgrade", "--yes")
	if r.ExitCode != 0 {
		t.Fatalf("kip upgrade --yes: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("measured: kip upgrade --yes after the failed one took %s\n%s", time.Since(start).Round(time.Second), r.Stderr)
	// The server cannot load wireguard: the pod network stays on VXLAN, said, and the rest runs.
	if rec, err := cluster.ReadInstalled(ctx, c.Dynamic); err != nil || rec.Network != cluster.NetworkVXLAN {
		t.Errorf("the cluster record's network after the upgrade: %q (%v), want VXLAN", rec.Network, err)
	}
	for _, want := range []string{"Longhorn stays at v" + olderLonghorn + ", the release the cluster runs; this kip pins v1.11.3, reached one minor at a time with kip upgrade --longhorn: v1.11.3", "Resuming", "Upgraded to kip",
		"The server's kernel cannot load the wireguard module, so the pod network stays on VXLAN"} {
		if !strings.Contains(r.Stdout+r.Stderr, want) {
			t.Errorf("kip upgrade --yes did not say %q", want)
		}
	}
	d, err := deployments.Get(ctx, "console-api", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	ct := pod.Containers[0]
	if ct.Image != "ghcr.io/getkipper/kipper-console-api:latest" {
		t.Errorf("console-api's image after the upgrade: %s", ct.Image)
	}
	if sc := ct.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil {
		t.Errorf("console-api's hardening after the upgrade: %+v / %+v", pod.SecurityContext, ct.SecurityContext)
	}
	if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "extra" }) ||
		!slices.ContainsFunc(ct.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/extra" }) {
		t.Errorf("the volume added by hand is gone: %+v %+v", pod.Volumes, ct.VolumeMounts)
	}
	for _, name := range []string{"console-api", "console"} {
		if alone, pending, err := kube.ServingAlone(ctx, c, "kipper-system", name); !alone {
			t.Errorf("%s after the upgrade: %s %v", name, pending, err)
		}
	}
	if after := dexConfig(ctx, t, c); !bytes.Equal(after, dex) {
		t.Error("the upgrade changed Dex's configuration")
	}
	chart, err := c.Dynamic.Resource(components.HelmCharts).Namespace(components.HelmChartNamespace).Get(ctx, "longhorn", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, _, _ := unstructured.NestedString(chart.Object, "spec", "version"); v != olderLonghorn {
		t.Errorf("Longhorn's chart after a plain upgrade: %s, want it kept at %s", v, olderLonghorn)
	}
	rec, _, err := cluster.ReadRecord(ctx, c.Dynamic)
	if err != nil || rec.KipVersion == "" || rec.Versions["console"] == "" {
		t.Errorf("the cluster record after the upgrade: %+v %v", rec, err)
	}
}

// dexConfig is Dex's whole configuration as the cluster holds it.
func dexConfig(ctx context.Context, t *testing.T, c *kube.Clients) []byte {
	t.Helper()
	cfg, err := components.ReadDexConfig(ctx, c)
	if err != nil || cfg == nil {
		t.Fatalf("read the Dex config: %v (found: %v)", err, cfg != nil)
	}
	return cfg
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
