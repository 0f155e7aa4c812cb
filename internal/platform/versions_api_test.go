package platform

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	helmtime "helm.sh/helm/v3/pkg/time"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/manifests"
	"kipper.run/kip/test/testenv"
)

const (
	testKip       = "v0.4.0-test"
	oldKip        = "v0.3.0"
	testServer    = "203.0.113.10"
	srvNodeName   = "pv-srv"
	workerName    = "pv-w1"
	oldKubernetes = "v1.36.4+k3s1"
)

// versionsFixture is a cluster as kip platform versions meets it: two nodes, workloads in system
// namespaces and one outside them, the App CRD stamped by an older kip, HelmCharts and Helm
// release state written by Helm's own storage driver in every state kip reports.
type versionsFixture struct {
	c      *kube.Clients
	pinned *manifests.Versions
	k3s    string
}

func newVersionsFixture(t *testing.T) *versionsFixture {
	t.Helper()
	env := testenv.Get(t)
	c, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := manifests.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	k3s, err := pinned.Component("k3s")
	if err != nil {
		t.Fatal(err)
	}
	f := &versionsFixture{c: c, pinned: pinned, k3s: k3s.Version}
	ctx := context.Background()

	env.AddNode(t, srvNodeName, testenv.NodeOptions{Labels: map[string]string{"node-role.kubernetes.io/control-plane": "true"}})
	env.AddNode(t, workerName, testenv.NodeOptions{})
	f.setKubeletVersion(t, srvNodeName, f.k3s)
	f.setKubeletVersion(t, workerName, oldKubernetes)

	for _, ns := range []string{"kipper-system", "traefik", "cert-manager", "dex", "zot", "keda", "velero"} {
		_, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	// Workloads: no replicas and a DaemonSet that fits no node, so that only their templates exist.
	apps := c.Kube.AppsV1()
	labels := map[string]string{"app": "pv"}
	template := func(init bool, images ...string) corev1.PodTemplateSpec {
		spec := corev1.PodSpec{NodeSelector: map[string]string{"kipper.run/no-such-node": "true"}}
		for i, im := range images {
			ct := corev1.Container{Name: "c" + string(rune('0'+i)), Image: im}
			if init && i == 0 {
				ct.Name = "migrate"
				spec.InitContainers = append(spec.InitContainers, ct)
				continue
			}
			spec.Containers = append(spec.Containers, ct)
		}
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}
	}
	selector := &metav1.LabelSelector{MatchLabels: labels}
	userNS := env.Namespace(t)
	for _, d := range []*appsv1.Deployment{
		{ObjectMeta: metav1.ObjectMeta{Name: "pv-console-api", Namespace: "kipper-system"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0),
			Selector: selector, Template: template(true, "ghcr.io/getkipper/kipper-console-api:migrate", "ghcr.io/getkipper/kipper-console-api:latest")}},
		{ObjectMeta: metav1.ObjectMeta{Name: "pv-user-app", Namespace: userNS}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0),
			Selector: selector, Template: template(false, "example.com/user-app:1")}},
	} {
		if _, err := apps.Deployments(d.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { apps.Deployments(d.Namespace).Delete(context.Background(), d.Name, metav1.DeleteOptions{}) })
	}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "pv-registry", Namespace: "zot"}, Spec: appsv1.StatefulSetSpec{
		Replicas: ptr.To[int32](0), Selector: selector, Template: template(false, "ghcr.io/project-zot/zot-linux-amd64:v2.1.18")}}
	if _, err := apps.StatefulSets(sts.Namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		apps.StatefulSets(sts.Namespace).Delete(context.Background(), sts.Name, metav1.DeleteOptions{})
	})
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "pv-svclb", Namespace: "traefik"}, Spec: appsv1.DaemonSetSpec{
		Selector: selector, Template: template(false, "rancher/klipper-lb:v0.4.13", "rancher/klipper-lb:v0.4.13")}}
	if _, err := apps.DaemonSets(ds.Namespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { apps.DaemonSets(ds.Namespace).Delete(context.Background(), ds.Name, metav1.DeleteOptions{}) })

	// The App CRD (installed with the environment), stamped by an older kip.
	var before string
	f.updateAppCRD(t, func(a map[string]string) map[string]string {
		before = a[components.KipVersionAnnotation]
		if a == nil {
			a = map[string]string{}
		}
		a[components.KipVersionAnnotation] = oldKip
		return a
	})
	t.Cleanup(func() {
		f.updateAppCRD(t, func(a map[string]string) map[string]string {
			if before == "" {
				delete(a, components.KipVersionAnnotation)
			} else {
				a[components.KipVersionAnnotation] = before
			}
			return a
		})
	})

	// The cluster record names the server the fix logs in to.
	if _, err := cluster.UpdateRecord(ctx, c.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Server, rec.Storage, rec.Profile = testServer, cluster.StorageLocal, "nano"
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// HelmCharts as kip applies them, at the pins.
	for _, name := range []string{"traefik", "cert-manager", "dex", "zot", "keda", "velero"} {
		f.helmChart(t, name)
	}
	// Helm's release state, written by Helm's own Secrets driver.
	f.release(t, "traefik", "traefik", 1, f.chartPin(t, "traefik"), "v3.7.13", release.StatusDeployed, "Install complete")
	f.release(t, "dex", "dex", 1, "0.23.0", "2.43.1", release.StatusDeployed, "Install complete")
	f.release(t, "dex", "dex", 2, f.chartPin(t, "dex"), "2.44.0", release.StatusFailed, `Upgrade "dex" failed: context deadline exceeded`)
	f.release(t, "zot", "zot", 1, "0.1.120", "v2.1.15", release.StatusDeployed, "Install complete")
	f.release(t, "keda", "keda", 1, f.chartPin(t, "keda"), "2.20.2", release.StatusPendingInstall, "Initial install underway")
	// A release Secret Helm cannot decode.
	bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.velero.v1", Namespace: "velero",
		Labels: map[string]string{"owner": "helm", "name": "velero", "version": "1", "status": "deployed"}},
		Type: "helm.sh/release.v1", Data: map[string][]byte{"release": []byte("not a release")}}
	if _, err := c.Kube.CoreV1().Secrets("velero").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Kube.CoreV1().Secrets("velero").Delete(context.Background(), bad.Name, metav1.DeleteOptions{})
	})
	return f
}

func (f *versionsFixture) chartPin(t *testing.T, name string) string {
	t.Helper()
	p, err := f.pinned.Component(name)
	if err != nil {
		t.Fatal(err)
	}
	return p.ChartVersion
}

func (f *versionsFixture) setKubeletVersion(t *testing.T, name, v string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := f.c.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.NodeInfo.KubeletVersion = v
		_, err = f.c.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (f *versionsFixture) updateAppCRD(t *testing.T, mutate func(map[string]string) map[string]string) {
	t.Helper()
	ctx := context.Background()
	crds := f.c.APIExt.ApiextensionsV1().CustomResourceDefinitions()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		crd, err := crds.Get(ctx, components.AppCRD, metav1.GetOptions{})
		if err != nil {
			return err
		}
		crd.Annotations = mutate(crd.Annotations)
		_, err = crds.Update(ctx, crd, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// helmChart creates the component's HelmChart in kube-system as kip renders it.
func (f *versionsFixture) helmChart(t *testing.T, name string) {
	t.Helper()
	cat, err := components.Catalogue(f.pinned)
	if err != nil {
		t.Fatal(err)
	}
	charts, err := components.Charts(cat)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(charts, func(c components.Chart) bool { return c.Component == name })
	if i < 0 {
		t.Fatalf("no chart %s in the catalogue", name)
	}
	ch := charts[i]
	hc := &helmv1.HelmChart{
		TypeMeta:   metav1.TypeMeta{APIVersion: helmv1.SchemeGroupVersion.String(), Kind: "HelmChart"},
		ObjectMeta: metav1.ObjectMeta{Name: ch.Release, Namespace: components.HelmChartNamespace},
		Spec:       helmv1.HelmChartSpec{Chart: ch.Chart, Repo: ch.Repo, Version: ch.Version, TargetNamespace: ch.Namespace},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(hc)
	if err != nil {
		t.Fatal(err)
	}
	res := f.c.Dynamic.Resource(helmv1.SchemeGroupVersion.WithResource("helmcharts")).Namespace(components.HelmChartNamespace)
	if _, err := res.Create(context.Background(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Delete(context.Background(), ch.Release, metav1.DeleteOptions{}) })
}

// release writes revision rev of release name in ns with Helm's Secrets driver.
func (f *versionsFixture) release(t *testing.T, name, ns string, rev int, chartVersion, appVersion string, status release.Status, desc string) {
	t.Helper()
	secrets := f.c.Kube.CoreV1().Secrets(ns)
	when := helmtime.Time{Time: time.Date(2026, 7, 1, 10, rev, 0, 0, time.UTC)}
	rel := &release.Release{
		Name: name, Namespace: ns, Version: rev,
		Chart: &chart.Chart{Metadata: &chart.Metadata{APIVersion: "v2", Name: name, Version: chartVersion, AppVersion: appVersion}},
		Info:  &release.Info{FirstDeployed: when, LastDeployed: when, Status: status, Description: desc},
	}
	if err := storage.Init(driver.NewSecrets(secrets)).Create(rel); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		secrets.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "owner=helm,name=" + name})
	})
}

func (f *versionsFixture) options(json bool, out *bytes.Buffer) *VersionsOptions {
	return &VersionsOptions{JSON: json, Out: out, KipVersion: testKip, Kube: func() (*kube.Clients, error) { return f.c, nil }}
}

func TestVersionsAPI(t *testing.T) {
	f := newVersionsFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var out bytes.Buffer
	if err := Versions(ctx, f.options(true, &out)); err != nil {
		t.Fatal(err)
	}
	var r VersionsReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("-o json is not a VersionsReport: %v\n%s", err, out.String())
	}

	if r.Kip != (KipVersions{Recorded: oldKip, Running: testKip}) {
		t.Errorf("kip %+v, want recorded %s, running %s", r.Kip, oldKip, testKip)
	}
	if r.ConsoleAPI.Recorded {
		t.Errorf("console-api %+v, want no build recorded", r.ConsoleAPI)
	}
	if r.PinnedK3s != f.k3s {
		t.Errorf("pinnedK3s %q, want %q", r.PinnedK3s, f.k3s)
	}

	// Nodes: the server first, each with the version its kubelet reports.
	nodes := map[string]NodeVersion{}
	for _, n := range r.Nodes {
		nodes[n.Name] = n
	}
	if n := nodes[srvNodeName]; n.Role != cluster.RoleServer || n.Kubernetes != f.k3s {
		t.Errorf("node %s: %+v, want a server on %s", srvNodeName, n, f.k3s)
	}
	if n := nodes[workerName]; n.Role != cluster.RoleWorker || n.Kubernetes != oldKubernetes {
		t.Errorf("node %s: %+v, want a worker on %s", workerName, n, oldKubernetes)
	}
	if len(r.Nodes) > 0 && r.Nodes[0].Role != cluster.RoleServer {
		t.Errorf("nodes %+v: the server is not first", r.Nodes)
	}

	// Charts: one of each state.
	charts := map[string]ChartVersion{}
	for _, ch := range r.Charts {
		charts[ch.Component] = ch
	}
	check := func(name, state string, want func(ChartVersion) bool) {
		t.Helper()
		ch, ok := charts[name]
		if !ok {
			t.Errorf("no chart %s in %+v", name, r.Charts)
			return
		}
		if ch.State != state || (want != nil && !want(ch)) {
			t.Errorf("chart %s: %+v, want state %s", name, ch, state)
		}
	}
	check("traefik", ChartOK, func(c ChartVersion) bool {
		return c.Installed == c.Pinned && c.HelmChart == c.Pinned && c.AppVersion == "v3.7.13" && c.Revision == 1 &&
			c.Status == "deployed" && c.Namespace == "traefik" && c.Updated != nil && c.Updated.Equal(time.Date(2026, 7, 1, 10, 1, 0, 0, time.UTC))
	})
	check("dex", ChartFailed, func(c ChartVersion) bool {
		return c.Revision == 2 && c.Installed == f.chartPin(t, "dex") && c.Status == "failed" &&
			c.Description == `Upgrade "dex" failed: context deadline exceeded` &&
			c.Deployed != nil && *c.Deployed == (Revision{Revision: 1, Chart: "0.23.0"}) &&
			slices.Equal(c.Fix, failedReleaseFix(testServer, "dex", "dex"))
	})
	check("zot", ChartDiffers, func(c ChartVersion) bool { return c.Installed == "0.1.120" && c.Pinned == f.chartPin(t, "zot") })
	check("keda", ChartPending, func(c ChartVersion) bool { return c.Status == "pending-install" })
	check("cert-manager", ChartNoRelease, func(c ChartVersion) bool { return c.HelmChart == f.chartPin(t, "cert-manager") && c.Installed == "" })
	check("longhorn", ChartNotInstalled, func(c ChartVersion) bool { return c.HelmChart == "" && c.Namespace == "longhorn-system" })
	check("velero", ChartError, func(c ChartVersion) bool { return strings.Contains(c.Error, "cannot be decoded") })

	// Workloads: every kind in the system namespaces, init containers first, none from elsewhere.
	var got []string
	for _, w := range r.Workloads {
		if !slices.Contains(r.Namespaces, w.Namespace) {
			t.Errorf("workload %s/%s is not in a system namespace", w.Namespace, w.Name)
		}
		if strings.HasPrefix(w.Name, "pv-") {
			for _, im := range w.Images {
				got = append(got, w.Namespace+" "+w.Kind+" "+w.Name+" "+im.Container+" "+im.Image+map[bool]string{true: " init"}[im.Init])
			}
		}
	}
	want := []string{
		"kipper-system Deployment pv-console-api migrate ghcr.io/getkipper/kipper-console-api:migrate init",
		"kipper-system Deployment pv-console-api c1 ghcr.io/getkipper/kipper-console-api:latest",
		"traefik DaemonSet pv-svclb c0 rancher/klipper-lb:v0.4.13",
		"traefik DaemonSet pv-svclb c1 rancher/klipper-lb:v0.4.13",
		"zot StatefulSet pv-registry c0 ghcr.io/project-zot/zot-linux-amd64:v2.1.18",
	}
	if !slices.Equal(got, want) {
		t.Errorf("workloads:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	for _, w := range []string{
		"Helm release dex in dex is failed at revision 2: see the fix under Charts",
		"zot runs chart zot 0.1.120, this kip pins " + f.chartPin(t, "zot"),
		"Helm release keda in keda is pending-install at revision 1",
		"node " + workerName + " runs " + oldKubernetes + ", this kip pins k3s " + f.k3s,
		"cert-manager has a HelmChart but no Helm release in cert-manager yet",
	} {
		if !slices.ContainsFunc(r.Warnings, func(s string) bool { return strings.HasPrefix(s, w) }) {
			t.Errorf("no warning %q in %q", w, r.Warnings)
		}
	}

	// The text report.
	out.Reset()
	if err := Versions(ctx, f.options(false, &out)); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Logf("kip platform versions:\n%s", text)
	for _, w := range []string{
		"kip: " + oldKip + " recorded on the App CRD, this kip " + testKip + "\n",
		"console-api: " + ConsoleAPIUnknown + "\n",
		"✗ Helm release dex in dex is failed at revision 2 (chart " + f.chartPin(t, "dex") + ")\n",
		"    revision 1 (chart 0.23.0) is the last deployed\n",
		"      ssh root@" + testServer + "\n",
		"      kubectl -n dex delete secret -l owner=helm,name=dex\n",
		`      kubectl -n kube-system annotate helmchart dex kip.kipper/reapply="$(date +%s)" --overwrite` + "\n",
		"pv-console-api", "migrate (init)", "rancher/klipper-lb:v0.4.13",
	} {
		if !strings.Contains(text, w) {
			t.Errorf("text report lacks %q:\n%s", w, text)
		}
	}
	if strings.Contains(text, "pv-user-app") {
		t.Errorf("text report lists a workload outside the system namespaces:\n%s", text)
	}

	// console-api records its build at startup.
	cms := f.c.Kube.CoreV1().ConfigMaps(ConsoleAPIBuildNamespace)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConsoleAPIBuildConfigMap, Namespace: ConsoleAPIBuildNamespace},
		Data: map[string]string{"version": "v1.8.0", "commit": "0a1b2c3", "startedAt": "2026-07-01T10:31:00Z", "pod": "console-api-7d9f-abcde"}}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cms.Delete(context.Background(), cm.Name, metav1.DeleteOptions{}) })
	rep, err := CollectVersions(ctx, f.options(false, nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := (ConsoleAPIBuild{Recorded: true, Version: "v1.8.0", Commit: "0a1b2c3", StartedAt: "2026-07-01T10:31:00Z", Pod: "console-api-7d9f-abcde"}); rep.ConsoleAPI != want {
		t.Errorf("console-api %+v, want %+v", rep.ConsoleAPI, want)
	}
}
