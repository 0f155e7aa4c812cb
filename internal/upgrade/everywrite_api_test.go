//go:build kipfault

package upgrade

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/helmstandin"
	"kipper.run/kip/test/testenv"
)

// helperKubeconfig, set, makes the test binary the helper process that runs kip upgrade --yes
// --repair-autoscaling off a terminal against the parent's API server.
const helperKubeconfig = "KIP_UPGRADE_HELPER_KUBECONFIG"

// olderTraefik is the Traefik chart an earlier kip installed: the upgrade moves it to the pin.
const olderTraefik = "1.0.0"

func init() { asHelper = faulttest.AsHelper(helperKubeconfig, helperUpgrade) }

func helperUpgrade(kubeconfig string) error {
	cl, err := faulttest.Clients(kubeconfig)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	o := quietOptions(cl, &out)
	o.RepairAutoscaling = true
	o.Prompter = cli.NewPrompter(&cli.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out}, true) // --yes
	err = Run(context.Background(), o)
	os.Stderr.Write(out.Bytes())
	return err
}

// TestUpgradeKilledAfterEveryWrite kills kip upgrade --yes --repair-autoscaling right after each
// of its writes in turn (the CRDs, console-api's RBAC and admission policies, each console
// Deployment's restart, each system component's objects, the cluster record, the autoscaling
// fix), each run resuming what the one before left, and checks that the end state is the
// uninterrupted upgrade's:
//   - the console layer as TestUpgradeConsoleLayer's checkUpgraded has it: the CRD marker,
//     console-api hardened with the hand-added volume kept, both Deployments restarted once by
//     the same upgrade and serving alone on their new pods, the fix written, the record finished;
//   - each system component as the upgrade renders it (Traefik moved from an earlier kip's
//     chart to the pin, cert-manager given its DNS resolvers at the release it runs), its
//     install Job the one helm-controller made for the chart as it is, Complete.
//
// The charts' install Jobs are made by the helm-controller stand-in (test/helmstandin), run in
// this process, which goes on while kip is killed, as k3s's does; kwok completes their pods.
// After each kill, a component the upgrade's check would take as done must have its Job made
// for the chart as it now is: a chart changed by the killed run is not installed until
// helm-controller replaces its Job.
func TestUpgradeKilledAfterEveryWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	env, cl := installed(ctx, t, "upgrade-every-write-node")
	runHelmController(t, env)
	earlierSystem(ctx, t, cl)
	// A kip from before the project operator roles: the console layer's RBAC step writes each of
	// kipper-base's objects again.
	for _, role := range components.ProjectRoles() {
		if err := cl.Kube.RbacV1().ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	operatorEdits(ctx, t, cl)
	ns := projectNamespace(t, cl, "every", "prod")
	bounds := map[string]any{"enabled": true, "minReplicas": int64(2), "maxReplicas": int64(5), "cpuTarget": int64(70)}
	addApp(t, cl, ns, "api", map[string]any{"replicas": int64(1), "autoscale": bounds}, 3)
	system, base := upgradedSystem(ctx, t, cl)

	made := filepath.Join(t.TempDir(), "made")
	before := template(ctx, t, cl, "console-api").Annotations[upgradedAtAnnotation] // an earlier test's, or none
	marks := map[string]bool{}
	writes := faulttest.KillEveryWrite(t, "kip upgrade --yes --repair-autoscaling", func() (syscall.Signal, string) {
		r := faulttest.Run(t, 5*time.Minute, helperKubeconfig+"="+env.KubeconfigPath, fault.KillNewWriteEnv+"="+made)
		if r.Signal == 0 && r.Exit != 0 {
			t.Fatalf("the upgrade failed:\n%s", r.Stderr)
		}
		return r.Signal, r.Stderr
	}, func(write string) {
		// Whatever the run was killed after, a resumed upgrade restarts the console with the
		// mark the first run chose, never with one of its own.
		marks[template(ctx, t, cl, "console-api").Annotations[upgradedAtAnnotation]] = true
		for _, c := range system {
			done, err := components.Step(cl, c).Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if done {
				if stale := staleJob(ctx, t, cl, c); stale != "" {
					t.Errorf("killed after %s: %s counts as done, but %s", write, c.Name, stale)
				}
			}
		}
	})
	t.Logf("writes killed after:\n%s", strings.Join(writes, "\n"))
	for what, path := range map[string]string{
		"the fix": "/apis/kipper.run/v1alpha1/namespaces/" + ns + "/apps/api", "console-api's restart": "/namespaces/kipper-system/deployments/console-api",
		"Traefik's chart": "/helmcharts/traefik", "a project role": "/clusterroles/" + components.ProjectOwnerRole,
		"cert-manager's ClusterIssuer": "/clusterissuers/",
	} {
		if !slices.ContainsFunc(writes, func(w string) bool { return strings.Contains(w, path) }) {
			t.Errorf("no kill after %s (%s) among the writes", what, path)
		}
	}
	checkUpgraded(ctx, t, cl, ns)
	// Until the upgrade wrote its mark the template kept the one before; after, only the
	// upgrade's: no resumed run restarted the console with a mark of its own.
	mark := template(ctx, t, cl, "console-api").Annotations[upgradedAtAnnotation]
	for m := range marks {
		if m != mark && m != before {
			t.Errorf("console-api was restarted with mark %q besides the upgrade's %q", m, mark)
		}
	}
	if done, err := components.Step(cl, base).Check(ctx); err != nil || !done {
		t.Errorf("console-api's RBAC and the project roles after the upgrade: done %v, %v", done, err)
	}
	for _, c := range system {
		if done, err := components.Step(cl, c).Check(ctx); err != nil || !done {
			t.Errorf("%s after the upgrade: done %v, %v", c.Name, done, err)
		}
		if stale := staleJob(ctx, t, cl, c); stale != "" {
			t.Errorf("%s after the upgrade: %s", c.Name, stale)
		}
	}
	if v := chartSpec(ctx, t, cl, "traefik").Version; v == olderTraefik {
		t.Errorf("Traefik's chart after the upgrade: still %s", v)
	}
	if values := chartSpec(ctx, t, cl, "cert-manager").ValuesContent; !strings.Contains(values, "dns01RecursiveNameservers") {
		t.Errorf("cert-manager's values after the upgrade have no DNS resolvers:\n%s", values)
	}
	rec, err := cluster.ReadInstalled(ctx, cl.Dynamic)
	if err != nil || rec.Versions["traefik"] != componentNamed(t, system, "traefik").Version {
		t.Errorf("the cluster record after the upgrade: %+v, %v", rec.Versions, err)
	}
}

// runHelmController runs the helm-controller stand-in against env until the test ends, with
// the chart fixtures it needs: cert-manager's chart brings the ClusterIssuer kind
// (helmstandin.CertManagerFixture). When the test ends, the charts go (their Jobs with them)
// before the controller stops.
func runHelmController(t *testing.T, env *testenv.Env) {
	t.Helper()
	fixtures := t.TempDir()
	dir := filepath.Join(fixtures, "cert-manager")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "crds.yaml"), []byte(helmstandin.CertManagerFixture), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := helmstandin.New(env.Config, fixtures, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	hctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(hctx) }()
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer func() { stop(); <-done }()
		charts := cl.Dynamic.Resource(components.HelmCharts).Namespace(components.HelmChartNamespace)
		if err := charts.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("delete the test's HelmCharts: %v", err)
		}
	})
}

// testWriter logs what the helm-controller stand-in says through t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log("helm-controller: " + strings.TrimSpace(string(p)))
	return len(p), nil
}

// earlierSystem installs the system components as an earlier kip left them: Traefik's chart at
// olderTraefik, cert-manager's values without the DNS resolvers this kip sets and its
// ClusterIssuer with another contact address, the others as this kip renders them; each
// installed (helm-controller's Job Complete) before the upgrade.
func earlierSystem(ctx context.Context, t *testing.T, cl *kube.Clients) {
	t.Helper()
	u, err := newUpgrader(ctx, &Options{KipVersion: installedBy}, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range u.system() {
		objs := make([]*unstructured.Unstructured, len(c.Objects))
		for i, o := range c.Objects {
			objs[i] = o.DeepCopy()
			if o.GetKind() != "HelmChart" {
				continue
			}
			switch o.GetName() {
			case "traefik":
				if err := unstructured.SetNestedField(objs[i].Object, olderTraefik, "spec", "version"); err != nil {
					t.Fatal(err)
				}
			case "cert-manager":
				values, _, _ := unstructured.NestedString(o.Object, "spec", "valuesContent")
				var kept []string
				for _, line := range strings.Split(values, "\n") {
					if !strings.Contains(line, "dns01RecursiveNameservers") {
						kept = append(kept, line)
					}
				}
				if err := unstructured.SetNestedField(objs[i].Object, strings.Join(kept, "\n"), "spec", "valuesContent"); err != nil {
					t.Fatal(err)
				}
			}
		}
		c.Objects = objs
		if c.Name == "cert-manager" {
			issuer := c.After[0].DeepCopy()
			if err := unstructured.SetNestedField(issuer.Object, "earlier@example.com", "spec", "acme", "email"); err != nil {
				t.Fatal(err)
			}
			c.After = append([]*unstructured.Unstructured{issuer}, c.After[1:]...)
		}
		if err := components.Apply(ctx, cl, c); err != nil {
			t.Fatalf("install %s as an earlier kip did: %v", c.Name, err)
		}
	}
}

// upgradedSystem are the system components as kip upgrade renders them for cl's cluster, and
// kipper-base as its console layer applies it (without the initial admin binding).
func upgradedSystem(ctx context.Context, t *testing.T, cl *kube.Clients) ([]components.Component, components.Component) {
	t.Helper()
	u, err := newUpgrader(ctx, &Options{KipVersion: upgradeKip}, cl)
	if err != nil {
		t.Fatal(err)
	}
	return u.system(), u.base()
}

func componentNamed(t *testing.T, comps []components.Component, name string) components.Component {
	t.Helper()
	for _, c := range comps {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no component %s", name)
	return components.Component{}
}

// chartSpec is the spec of the HelmChart name.
func chartSpec(ctx context.Context, t *testing.T, cl *kube.Clients, name string) helmv1.HelmChartSpec {
	t.Helper()
	u, err := cl.Dynamic.Resource(components.HelmCharts).Namespace(components.HelmChartNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var chart helmv1.HelmChart
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &chart); err != nil {
		t.Fatal(err)
	}
	return chart.Spec
}

// staleJob says how the install Job of each HelmChart of c is not the Complete one
// helm-controller made for the chart as it is now, "" when every one is.
func staleJob(ctx context.Context, t *testing.T, cl *kube.Clients, c components.Component) string {
	t.Helper()
	for _, o := range c.Objects {
		if o.GetKind() != "HelmChart" {
			continue
		}
		spec := chartSpec(ctx, t, cl, o.GetName())
		job, err := cl.Kube.BatchV1().Jobs(components.HelmChartNamespace).Get(ctx, "helm-install-"+o.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "its Job helm-install-" + o.GetName() + " does not exist"
		}
		if err != nil {
			t.Fatal(err)
		}
		if got, want := job.Spec.Template.Annotations[helmstandin.AnnotationConfigHash], helmstandin.SpecHash(spec); got != want {
			return "its Job helm-install-" + o.GetName() + " was made for another spec of the chart"
		}
		if !jobComplete(job) {
			return "its Job helm-install-" + o.GetName() + " is not Complete"
		}
	}
	return ""
}

func jobComplete(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
