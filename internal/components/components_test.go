package components

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	"golang.org/x/crypto/bcrypt"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/manifests"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata")

func testProfile(t testing.TB, name string) cluster.Profile {
	t.Helper()
	p, err := cluster.ProfileNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testPinned(t testing.TB) *manifests.Versions {
	t.Helper()
	v, err := manifests.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// options is a fresh install of profile on storage, monitoring as the profile has it.
func testOptions(t testing.TB, profileName, storage string) Options {
	t.Helper()
	p := testProfile(t, profileName)
	return Options{
		Sizing:        cluster.Sizing{Profile: p, Storage: storage},
		Monitoring:    cluster.Monitoring{Prometheus: p.Monitoring, Loki: p.Monitoring},
		AdminEmail:    "admin@example.com",
		ServerAddress: "203.0.113.10",
		Pinned:        testPinned(t),
		KipVersion:    "v0.40.0",
	}
}

func renderComponents(t testing.TB, o Options) []Component {
	t.Helper()
	comps, err := Render(o)
	if err != nil {
		t.Fatal(err)
	}
	return comps
}

func componentNames(comps []Component) []string {
	out := make([]string, len(comps))
	for i, c := range comps {
		out[i] = c.Name
	}
	return out
}

func componentNamed(t testing.TB, comps []Component, name string) Component {
	t.Helper()
	for _, c := range comps {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no component %s in %v", name, componentNames(comps))
	return Component{}
}

// find returns the object of kind and name among objs.
func findObject(t testing.TB, objs []*unstructured.Unstructured, kind, namespace, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == namespace && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s/%s", kind, namespace, name)
	return nil
}

// fromUnstructured converts u into out.
func fromUnstr(t testing.TB, u *unstructured.Unstructured, out runtime.Object) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatalf("convert %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// chartOf returns the HelmChart of c and its values.
func chartValues(t testing.TB, c Component) (*helmv1.HelmChart, map[string]any) {
	t.Helper()
	var hc helmv1.HelmChart
	fromUnstr(t, findObject(t, c.Objects, "HelmChart", "kube-system", c.Name), &hc)
	values := map[string]any{}
	if err := yaml.Unmarshal([]byte(hc.Spec.ValuesContent), &values); err != nil {
		t.Fatalf("%s values: %v", c.Name, err)
	}
	return &hc, values
}

// value digs a value out of nested maps.
func nestedValue(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

func secretDataOf(t testing.TB, u *unstructured.Unstructured) map[string][]byte {
	t.Helper()
	var s corev1.Secret
	fromUnstr(t, u, &s)
	return s.Data
}

func TestComponentsByProfileAndStorage(t *testing.T) {
	withBackups := func(o Options) Options {
		o.Backups = &BackupStorage{Bucket: "backups", Endpoint: "https://s3.example.com", AccessKeyID: "AKIAEXAMPLE", SecretAccessKey: "wJalrXUtnFEMIEXAMPLEKEY"}
		return o
	}
	for _, tt := range []struct {
		name string
		o    Options
		want []string
	}{
		{"nano on local storage", testOptions(t, "nano", cluster.StorageLocal),
			[]string{"kipper-crds", "kipper-base", "traefik", "cert-manager", "dex", "zot", "keda", "console"}},
		{"nano on local storage with backup storage", withBackups(testOptions(t, "nano", cluster.StorageLocal)),
			[]string{"kipper-crds", "kipper-base", "traefik", "cert-manager", "dex", "zot", "keda", "velero", "console"}},
		{"small on longhorn", testOptions(t, "small", cluster.StorageLonghorn),
			[]string{"kipper-crds", "kipper-base", "traefik", "cert-manager", "longhorn", "dex", "zot", "keda", "minio", "velero", "prometheus", "loki", "console"}},
		{"small on longhorn with backup storage", withBackups(testOptions(t, "small", cluster.StorageLonghorn)),
			[]string{"kipper-crds", "kipper-base", "traefik", "cert-manager", "longhorn", "dex", "zot", "keda", "velero", "prometheus", "loki", "console"}},
		{"nano on longhorn", testOptions(t, "nano", cluster.StorageLonghorn),
			[]string{"kipper-crds", "kipper-base", "traefik", "cert-manager", "longhorn", "dex", "zot", "keda", "minio", "velero", "console"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := componentNames(renderComponents(t, tt.o)); !slices.Equal(got, tt.want) {
				t.Errorf("components\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestMonitoringFollowsTheRecord(t *testing.T) {
	o := testOptions(t, "nano", cluster.StorageLocal)
	o.Monitoring = cluster.Monitoring{Prometheus: true} // kip platform enable prometheus on nano
	comps := renderComponents(t, o)
	if got := componentNames(comps); !slices.Contains(got, "prometheus") || slices.Contains(got, "loki") {
		t.Fatalf("components %v, want prometheus and no loki", got)
	}
	_, values := chartValues(t, componentNamed(t, comps, "prometheus"))
	// Nano keeps no retention of its own: the smallest profile's applies.
	if got := nestedValue(values, "prometheus", "prometheusSpec", "retention"); got != "3d" {
		t.Errorf("prometheus retention on nano = %v, want 3d", got)
	}
	if nestedValue(values, "grafana", "additionalDataSources") != nil {
		t.Error("grafana has a Loki data source without Loki")
	}

	o = testOptions(t, "large", cluster.StorageLonghorn)
	comps = renderComponents(t, o)
	_, values = chartValues(t, componentNamed(t, comps, "prometheus"))
	if got := nestedValue(values, "prometheus", "prometheusSpec", "retention"); got != "30d" {
		t.Errorf("prometheus retention on large = %v, want 30d", got)
	}
	if nestedValue(values, "grafana", "additionalDataSources") == nil {
		t.Error("grafana has no Loki data source")
	}
	_, values = chartValues(t, componentNamed(t, comps, "loki"))
	if got := nestedValue(values, "loki", "limits_config", "retention_period"); got != "14d" {
		t.Errorf("loki retention on large = %v, want 14d", got)
	}
}

func TestChartsArePinned(t *testing.T) {
	v := testPinned(t)
	for _, c := range renderComponents(t, testOptions(t, "small", cluster.StorageLonghorn)) {
		for _, o := range c.Objects {
			if o.GetKind() != "HelmChart" {
				continue
			}
			var hc helmv1.HelmChart
			fromUnstr(t, o, &hc)
			pin, err := v.Component(c.Name)
			if err != nil {
				t.Fatal(err)
			}
			if hc.Spec.Chart != pin.Chart || hc.Spec.Repo != pin.Repo || hc.Spec.Version != pin.ChartVersion {
				t.Errorf("%s: HelmChart installs %s %s from %s, versions.yaml pins %s %s from %s",
					c.Name, hc.Spec.Chart, hc.Spec.Version, hc.Spec.Repo, pin.Chart, pin.ChartVersion, pin.Repo)
			}
			if c.Version != pin.Version {
				t.Errorf("%s: component version %s, pinned %s", c.Name, c.Version, pin.Version)
			}
			if hc.Namespace != "kube-system" || hc.Spec.TargetNamespace != c.Namespaces[0] {
				t.Errorf("%s: HelmChart %s/%s targets %s, component runs in %v", c.Name, hc.Namespace, hc.Name, hc.Spec.TargetNamespace, c.Namespaces)
			}
			if hc.Spec.FailurePolicy != helmv1.FailurePolicyAbort {
				t.Errorf("%s: failure policy %q, want abort", c.Name, hc.Spec.FailurePolicy)
			}
			// The target namespace is applied by kip, before the chart.
			findObject(t, c.Objects, "Namespace", "", hc.Spec.TargetNamespace)
		}
	}
}

// TestLonghornStaysAtItsRelease renders a cluster that runs an older Longhorn release: its
// HelmChart keeps that release, with the settings kip pins;
// a cluster without Longhorn gets the pinned release.
func TestLonghornStaysAtItsRelease(t *testing.T) {
	o := testOptions(t, "small", cluster.StorageLonghorn)
	o.Kept = map[string]string{"longhorn": "v1.9.2"}
	pinned := testPinned(t)
	for _, c := range renderComponents(t, o) {
		if c.Name != "longhorn" {
			continue
		}
		hc, values := chartValues(t, c)
		if c.Version != "v1.9.2" || hc.Spec.Version != "1.9.2" || nestedValue(values, "defaultSettings", "nodeDrainPolicy") != "block-for-eviction-if-contains-last-replica" {
			t.Errorf("Longhorn on a cluster that runs v1.9.2: component %s, chart %s, settings %v", c.Version, hc.Spec.Version, nestedValue(values, "defaultSettings"))
		}
	}
	o.Kept = nil
	pin, err := pinned.Component("longhorn")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range renderComponents(t, o) {
		if c.Name != "longhorn" {
			continue
		}
		if hc, _ := chartValues(t, c); c.Version != pin.Version || hc.Spec.Version != pin.ChartVersion {
			t.Errorf("Longhorn on a cluster without it: component %s, chart %s; want the pin %s", c.Version, hc.Spec.Version, pin.ChartVersion)
		}
	}
}

// TestCertManagerKeptWithItsResolvers renders cert-manager kept at an older release, as kip
// upgrade does: its chart version keeps the v (cert-manager's charts are versioned so), and the
// pinned DNS resolvers are in its values either way; a component whose chart version does not
// name its release cannot be kept, nor a release written without its v.
func TestCertManagerKeptWithItsResolvers(t *testing.T) {
	o := testOptions(t, "nano", cluster.StorageLocal)
	for _, kept := range []string{"", "v1.20.0"} {
		o.Kept = map[string]string{"cert-manager": kept}
		c := componentNamed(t, renderComponents(t, o), "cert-manager")
		hc, values := chartValues(t, c)
		want := testPinned(t)
		pin, err := want.Component("cert-manager")
		if err != nil {
			t.Fatal(err)
		}
		if kept != "" {
			pin.Version, pin.ChartVersion = kept, kept
		}
		if c.Version != pin.Version || hc.Spec.Version != pin.ChartVersion {
			t.Errorf("cert-manager kept at %q: component %s, chart %s; want %s, %s", kept, c.Version, hc.Spec.Version, pin.Version, pin.ChartVersion)
		}
		if nestedValue(values, "dns01RecursiveNameservers") != "1.1.1.1:53,9.9.9.9:53" || nestedValue(values, "dns01RecursiveNameserversOnly") != true {
			t.Errorf("cert-manager kept at %q: values %v", kept, values)
		}
	}
	for _, kept := range []map[string]string{{"traefik": "v3.6.0"}, {"longhorn": "1.9.2"}} {
		o.Kept = kept
		if _, err := Render(o); err == nil {
			t.Errorf("Render kept %v", kept)
		}
	}
}

func TestEverythingIsLabelled(t *testing.T) {
	o := testOptions(t, "small", cluster.StorageLonghorn)
	o.Backups = &BackupStorage{Bucket: "b", AccessKeyID: "id", SecretAccessKey: "key"}
	for _, c := range renderComponents(t, o) {
		for _, list := range [][]*unstructured.Unstructured{c.Objects, c.CreateOnly, c.After} {
			for _, obj := range list {
				l := obj.GetLabels()
				if l["app.kubernetes.io/managed-by"] != "kip" || l["app.kubernetes.io/part-of"] != "kipper" {
					t.Errorf("%s: %s %s has labels %v", c.Name, obj.GetKind(), obj.GetName(), l)
				}
			}
		}
	}
}

func TestKipperCRDs(t *testing.T) {
	c := componentNamed(t, renderComponents(t, testOptions(t, "nano", cluster.StorageLocal)), "kipper-crds")
	var kinds []string
	for _, o := range c.Objects {
		if o.GetKind() != "CustomResourceDefinition" {
			t.Errorf("kipper-crds holds a %s", o.GetKind())
		}
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
		kinds = append(kinds, kind)
	}
	slices.Sort(kinds)
	if want := []string{"App", "ClusterIdentity", "Function", "Project", "Service"}; !slices.Equal(kinds, want) {
		t.Errorf("CRD kinds %v, want %v", kinds, want)
	}
	app := findObject(t, c.Objects, "CustomResourceDefinition", "", "apps.kipper.run")
	if got := app.GetAnnotations()["kipper.run/kip-version"]; got != "v0.40.0" {
		t.Errorf("App CRD records kip %q, want v0.40.0", got)
	}
}

func TestConsoleAPIHardenedAndSized(t *testing.T) {
	for _, p := range cluster.Profiles {
		c := componentNamed(t, renderComponents(t, testOptions(t, p.Name, cluster.StorageLocal)), "console")
		var d appsv1.Deployment
		fromUnstr(t, findObject(t, c.Objects, "Deployment", "kipper-system", "console-api"), &d)
		pod := d.Spec.Template.Spec
		if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
			psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: console-api pod security context %+v", p.Name, psc)
		}
		ctr := pod.Containers[0]
		sc := ctr.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: console-api container security context %+v", p.Name, sc)
		}
		if got := ctr.Resources.Limits[corev1.ResourceMemory]; got.Cmp(resource.MustParse(p.ConsoleAPIMemory)) != 0 {
			t.Errorf("%s: console-api memory limit %s, want %s", p.Name, got.String(), p.ConsoleAPIMemory)
		}
		if !strings.HasPrefix(ctr.Image, "ghcr.io/getkipper/kipper-console-api:") || ctr.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("%s: console-api image %s pulled %s", p.Name, ctr.Image, ctr.ImagePullPolicy)
		}
	}
}

func TestRegistryVolume(t *testing.T) {
	for _, storage := range []string{cluster.StorageLocal, cluster.StorageLonghorn} {
		for _, p := range cluster.Profiles {
			_, values := chartValues(t, componentNamed(t, renderComponents(t, testOptions(t, p.Name, storage)), "zot"))
			if got := nestedValue(values, "pvc", "storage"); got != p.RegistrySize {
				t.Errorf("%s/%s: registry volume %v, want %s", p.Name, storage, got, p.RegistrySize)
			}
			if got := nestedValue(values, "pvc", "storageClassName"); got != "local-path" {
				t.Errorf("%s/%s: registry class %v, want local-path", p.Name, storage, got)
			}
		}
	}
}

// TestLonghornSettings checks the pinned settings against longhorn-manager's own definitions (its
// types/setting.go, which kip's build cannot import) and that they are both chart defaults and
// Setting objects applied after the chart.
func TestLonghornSettings(t *testing.T) {
	c := componentNamed(t, renderComponents(t, testOptions(t, "small", cluster.StorageLonghorn)), "longhorn")
	_, values := chartValues(t, c)
	if nestedValue(values, "persistence", "defaultClass") != false {
		t.Error("Longhorn's class would be a default class")
	}
	if strings.Contains(findObject(t, c.Objects, "HelmChart", "kube-system", "longhorn").Object["spec"].(map[string]any)["valuesContent"].(string), "backupTarget") {
		t.Error("kip sets a Longhorn backup target")
	}
	src := longhornSettingsSource(t)
	want := map[string]string{
		"upgrade-checker":                                  "false",
		"allow-collecting-longhorn-usage-metrics":          "false",
		"fast-replica-rebuild-enabled":                     "false",
		"node-drain-policy":                                "block-for-eviction-if-contains-last-replica",
		"default-data-locality":                            string(longhornv1beta2.DataLocalityDisabled),
		"replica-auto-balance":                             string(longhornv1beta2.ReplicaAutoBalanceDisabled),
		"rwx-volume-fast-failover":                         "false",
		"node-down-pod-deletion-policy":                    "do-nothing",
		"allow-volume-creation-with-degraded-availability": "true",
	}
	settings := 0
	for _, o := range c.After {
		if o.GetKind() != "Setting" {
			continue
		}
		settings++
		var s longhornv1beta2.Setting
		fromUnstr(t, o, &s)
		if o.GetAPIVersion() != "longhorn.io/v1beta2" || s.Namespace != "longhorn-system" {
			t.Errorf("setting %s is %s in %s", s.Name, o.GetAPIVersion(), s.Namespace)
		}
		if w, ok := want[s.Name]; !ok || s.Value != w {
			t.Errorf("setting %s = %q, want %q", s.Name, s.Value, w)
		}
		if !regexp.MustCompile(`SettingName\("` + regexp.QuoteMeta(s.Name) + `"\)`).Match(src) {
			t.Errorf("longhorn-manager has no setting %s", s.Name)
		}
		if s.Value != "true" && s.Value != "false" && !regexp.MustCompile(`\("`+regexp.QuoteMeta(s.Value)+`"\)`).Match(src) &&
			s.Value != string(longhornv1beta2.DataLocalityDisabled) {
			t.Errorf("setting %s: longhorn-manager defines no value %q", s.Name, s.Value)
		}
	}
	if settings != len(want) {
		t.Errorf("%d Setting objects, want %d", settings, len(want))
	}
	for _, s := range longhornSettings {
		if got := nestedValue(values, "defaultSettings", s.chartKey); got != s.value {
			t.Errorf("chart defaultSettings.%s = %v, want %v", s.chartKey, got, s.value)
		}
	}
	class := findObject(t, c.After, "StorageClass", "", "longhorn")
	if got := class.GetAnnotations()["storageclass.kubernetes.io/is-default-class"]; got != "false" {
		t.Errorf("longhorn class is-default-class %q", got)
	}
	if _, ok := class.Object["provisioner"]; ok {
		t.Error("kip applies fields of Longhorn's class other than its annotation")
	}
}

// longhornSettingsSource returns types/setting.go of the longhorn-manager module kip builds with.
func longhornSettingsSource(t *testing.T) []byte {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/longhorn/longhorn-manager").Output()
	if err != nil {
		t.Fatalf("find the longhorn-manager module: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "types", "setting.go"))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func TestBackups(t *testing.T) {
	t.Run("external storage", func(t *testing.T) {
		o := testOptions(t, "nano", cluster.StorageLocal)
		o.Backups = &BackupStorage{Bucket: "backups", Endpoint: "https://s3.example.com", Region: "eu-west-1",
			AccessKeyID: "AKIAEXAMPLE", SecretAccessKey: "wJalrXUtnFEMIEXAMPLEKEY"}
		c := componentNamed(t, renderComponents(t, o), "velero")
		creds := secretDataOf(t, findObject(t, c.Objects, "Secret", "velero", "velero-credentials"))
		if got := string(creds["cloud"]); got != "[default]\naws_access_key_id=AKIAEXAMPLE\naws_secret_access_key=wJalrXUtnFEMIEXAMPLEKEY\n" {
			t.Errorf("velero credentials: %q", got)
		}
		if len(c.CreateOnly) != 0 {
			t.Error("external backup storage has objects created once: rotating keys needs them replaced")
		}
		_, values := chartValues(t, c)
		bsl := nestedValue(values, "configuration", "backupStorageLocation").([]any)[0].(map[string]any)
		if bsl["bucket"] != "backups" || nestedValue(bsl, "config", "s3Url") != "https://s3.example.com" || nestedValue(bsl, "config", "region") != "eu-west-1" {
			t.Errorf("backup location %v", bsl)
		}
		if nestedValue(values, "credentials", "existingSecret") != "velero-credentials" {
			t.Errorf("velero reads credentials %v", nestedValue(values, "credentials"))
		}
	})
	t.Run("in-cluster MinIO", func(t *testing.T) {
		comps := renderComponents(t, testOptions(t, "small", cluster.StorageLonghorn))
		minio := componentNamed(t, comps, "minio")
		creds := secretDataOf(t, findObject(t, minio.CreateOnly, "Secret", "velero", "velero-minio-credentials"))
		want := "[default]\naws_access_key_id=" + string(creds["rootUser"]) + "\naws_secret_access_key=" + string(creds["rootPassword"]) + "\n"
		if len(creds["rootPassword"]) < 32 || string(creds["cloud"]) != want {
			t.Errorf("MinIO's and Velero's credentials disagree")
		}
		_, mv := chartValues(t, minio)
		if nestedValue(mv, "existingSecret") != "velero-minio-credentials" || nestedValue(mv, "persistence", "storageClass") != "longhorn" {
			t.Errorf("minio values %v", mv)
		}
		if users, _ := nestedValue(mv, "users").([]any); len(users) != 0 {
			t.Errorf("minio has users %v", users)
		}
		_, vv := chartValues(t, componentNamed(t, comps, "velero"))
		if nestedValue(vv, "credentials", "existingSecret") != "velero-minio-credentials" {
			t.Errorf("velero reads credentials %v", nestedValue(vv, "credentials"))
		}
	})
}

// dexConfig returns the Dex config the dex component renders.
func renderedDexConfig(t testing.TB, c Component) []byte {
	t.Helper()
	return secretDataOf(t, findObject(t, c.Objects, "Secret", "dex", "dex-config"))["config.yaml"]
}

func TestDexFreshInstall(t *testing.T) {
	c := componentNamed(t, renderComponents(t, testOptions(t, "nano", cluster.StorageLocal)), "dex")
	config := renderedDexConfig(t, c)
	users, err := DexUsers(config)
	if err != nil || !slices.Equal(users, []string{"admin@example.com"}) {
		t.Fatalf("users %v %v", users, err)
	}
	// The hash comes from the admin password Secret, created once, through the environment.
	pw := secretDataOf(t, findObject(t, c.CreateOnly, "Secret", "dex", "kipper-admin-password"))
	if err := bcrypt.CompareHashAndPassword(pw["hash"], pw["password"]); err != nil {
		t.Errorf("admin password and hash disagree: %v", err)
	}
	if bytes.Contains(config, pw["hash"]) || bytes.Contains(config, pw["password"]) {
		t.Error("the dex config holds the admin's password or hash")
	}
	_, values := chartValues(t, c)
	env, _ := json.Marshal(values["envVars"])
	if !strings.Contains(string(env), `"key":"hash"`) || !strings.Contains(string(env), `"name":"kipper-admin-password"`) {
		t.Errorf("dex env %s", env)
	}
	if nestedValue(values, "configSecret", "name") != "dex-config" || nestedValue(values, "configSecret", "create") != false {
		t.Errorf("dex reads its config from %v", values["configSecret"])
	}
	// console-api's copy of the client secret is the one in the config.
	var parsed struct {
		Issuer        string `json:"issuer"`
		StaticClients []struct {
			ID     string `json:"id"`
			Secret string `json:"secret"`
		} `json:"staticClients"`
	}
	if err := yaml.Unmarshal(config, &parsed); err != nil {
		t.Fatal(err)
	}
	copyOf := string(secretDataOf(t, findObject(t, c.Objects, "Secret", "kipper-system", "dex-oidc-client"))["secret"])
	if parsed.StaticClients[0].ID != "kipper-console" || parsed.StaticClients[0].Secret != copyOf || len(copyOf) < 32 {
		t.Errorf("console client %+v, console-api's copy differs", parsed.StaticClients[0])
	}
	if parsed.Issuer != "https://dex.203.0.113.10.sslip.io" {
		t.Errorf("issuer %s", parsed.Issuer)
	}

	// A server known by a DNS name keeps it.
	o := testOptions(t, "nano", cluster.StorageLocal)
	o.ServerAddress = "k.example.com"
	comps := renderComponents(t, o)
	if err := yaml.Unmarshal(renderedDexConfig(t, componentNamed(t, comps, "dex")), &parsed); err != nil || parsed.Issuer != "https://dex.k.example.com" {
		t.Errorf("issuer for a DNS name %q %v", parsed.Issuer, err)
	}
	var ing networkingv1.Ingress
	fromUnstr(t, findObject(t, componentNamed(t, comps, "console").Objects, "Ingress", "kipper-system", "console"), &ing)
	if ing.Spec.Rules[0].Host != "console.k.example.com" {
		t.Errorf("console host %s", ing.Spec.Rules[0].Host)
	}
}

func TestInitialAdmin(t *testing.T) {
	comps := renderComponents(t, testOptions(t, "nano", cluster.StorageLocal))
	var crb rbacv1.ClusterRoleBinding
	fromUnstr(t, findObject(t, componentNamed(t, comps, "kipper-base").CreateOnly, "ClusterRoleBinding", "", "kipper-admins"), &crb)
	// The API server names a Dex login oidc:<email> (the installer's authentication config).
	if crb.RoleRef.Name != "cluster-admin" || len(crb.Subjects) != 1 || crb.Subjects[0].Kind != "User" || crb.Subjects[0].Name != "oidc:admin@example.com" {
		t.Errorf("initial admin binding %+v -> %s", crb.Subjects, crb.RoleRef.Name)
	}

	o := testOptions(t, "nano", cluster.StorageLocal)
	o.AdminEmail = ""
	comps = renderComponents(t, o)
	if n := len(componentNamed(t, comps, "kipper-base").CreateOnly) + len(componentNamed(t, comps, "dex").CreateOnly); n != 0 {
		t.Errorf("no admin email, yet %d objects made once for an admin", n)
	}
	if users, err := DexUsers(renderedDexConfig(t, componentNamed(t, comps, "dex"))); err != nil || len(users) != 0 {
		t.Errorf("no admin email, yet dex users %v %v", users, err)
	}
}

func TestDexRerunKeepsUsers(t *testing.T) {
	existing := []byte(`issuer: https://dex.203.0.113.10.sslip.io
enablePasswordDB: true
staticPasswords:
- email: admin@example.com
  hashFromEnv: KIPPER_ADMIN_PASSWORD_HASH
  username: admin
  userID: a1
- email: dev@example.com
  hash: "$2a$10$2b2cU8CPhOTaGrs1HRQuAueS7JTT5ZHsHSzYiFPm1leZck7Mc8T4W"
  username: dev
  userID: d1
staticClients:
- id: kipper-console
  secret: keep-this-client-secret
  redirectURIs: [https://console.203.0.113.10.sslip.io/callback]
`)
	o := testOptions(t, "nano", cluster.StorageLocal)
	o.ExistingDexConfig = existing
	c := componentNamed(t, renderComponents(t, o), "dex")
	config := renderedDexConfig(t, c)
	users, err := DexUsers(config)
	if err != nil || !slices.Equal(users, []string{"admin@example.com", "dev@example.com"}) {
		t.Fatalf("users after a re-run %v %v", users, err)
	}
	if !bytes.Contains(config, []byte("$2a$10$2b2cU8CPhOTaGrs1HRQuAueS7JTT5ZHsHSzYiFPm1leZck7Mc8T4W")) || !bytes.Contains(config, []byte("userID: d1")) {
		t.Error("a console user lost its password hash or ID")
	}
	if got := string(secretDataOf(t, findObject(t, c.Objects, "Secret", "kipper-system", "dex-oidc-client"))["secret"]); got != "keep-this-client-secret" {
		t.Error("the console's client secret changed on a re-run")
	}

	// A second --admin-email is refused: the first admin's hash comes from the environment, and a
	// second admin rendered the same way would log in with the first one's password.
	o.AdminEmail = "ops@example.com"
	if _, err := Render(o); err == nil || !strings.Contains(err.Error(), "add ops@example.com in the console") {
		t.Fatalf("a second admin email: %v, want a refusal", err)
	}

	// An admin whose password the console changed (an inline hash) keeps it, and kip makes no
	// password Secret that would not match it.
	o.AdminEmail = "dev@example.com"
	o.ExistingDexConfig = []byte(strings.Replace(string(existing), "hashFromEnv: KIPPER_ADMIN_PASSWORD_HASH", `hash: "$2a$10$2b2cU8CPhOTaGrs1HRQuAueS7JTT5ZHsHSzYiFPm1leZck7Mc8T4W"`, 1))
	c = componentNamed(t, renderComponents(t, o), "dex")
	if len(c.CreateOnly) != 0 {
		t.Error("kip makes an admin password no user reads")
	}
	if _, values := chartValues(t, c); values["envVars"] != nil {
		t.Errorf("dex env %v without a user reading it", values["envVars"])
	}
}

func TestDexUsersRejectsMalformed(t *testing.T) {
	for _, config := range []string{"", "staticPasswords: nope", "staticPasswords:\n- just-a-string-s3cret", "::: not yaml :::\n\t- x"} {
		_, err := DexUsers([]byte(config))
		if err == nil {
			t.Errorf("DexUsers(%q) accepted it", config)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "nope") {
			t.Errorf("error quotes the config: %v", err)
		}
	}
}

// TestSecretsStayInSecrets renders every secret kip knows or makes and checks that none appears
// outside Secret objects, in component names or versions, or in errors.
func TestSecretsStayInSecrets(t *testing.T) {
	const accessKey, secretKey = "AKIA-ACCESS-KEY-ID-1234", "SECRET-ACCESS-KEY-abcdef-5678"
	o := testOptions(t, "small", cluster.StorageLonghorn)
	o.Backups = &BackupStorage{Bucket: "backups", Endpoint: "https://s3.example.com", AccessKeyID: accessKey, SecretAccessKey: secretKey}
	secrets := []string{accessKey, secretKey}
	var comps []Component
	for _, backups := range []*BackupStorage{o.Backups, nil} {
		o.Backups = backups
		comps = append(comps, renderComponents(t, o)...)
	}
	for _, c := range comps {
		for _, list := range [][]*unstructured.Unstructured{c.Objects, c.CreateOnly, c.After} {
			for _, obj := range list {
				if obj.GetKind() != "Secret" {
					continue
				}
				for k, v := range secretDataOf(t, obj) {
					// generated passwords, client secrets, hashes (not emails or user names)
					if k != "email" && k != "rootUser" && len(v) >= 16 && !bytes.Contains(v, []byte("\n")) {
						secrets = append(secrets, string(v))
					}
				}
			}
		}
	}
	for _, c := range comps {
		for _, s := range secrets {
			if strings.Contains(c.Name, s) || strings.Contains(c.Version, s) {
				t.Errorf("component %s names a secret", c.Name)
			}
		}
		for _, list := range [][]*unstructured.Unstructured{c.Objects, c.CreateOnly, c.After} {
			for _, obj := range list {
				if obj.GetKind() == "Secret" {
					continue
				}
				js, err := json.Marshal(obj.Object)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range secrets {
					if strings.Contains(string(js), s) {
						t.Errorf("%s: %s %s holds a secret", c.Name, obj.GetKind(), obj.GetName())
					}
				}
			}
		}
	}

	for _, b := range []BackupStorage{
		{Endpoint: "https://s3.example.com", AccessKeyID: accessKey, SecretAccessKey: secretKey},
		{Bucket: "b", AccessKeyID: accessKey},
		{Bucket: "b", SecretAccessKey: secretKey},
		{Bucket: "b", Endpoint: "https://" + accessKey + ":" + secretKey + "@s3.example.com", AccessKeyID: accessKey, SecretAccessKey: secretKey},
		{Bucket: "b", Endpoint: "s3.example.com/" + secretKey, AccessKeyID: accessKey, SecretAccessKey: secretKey},
	} {
		o.Backups = &b
		_, err := Render(o)
		if err == nil {
			t.Errorf("backup storage %+v accepted", b.Bucket)
			continue
		}
		if strings.Contains(err.Error(), accessKey) || strings.Contains(err.Error(), secretKey) {
			t.Errorf("error names a credential: %v", err)
		}
	}
	o.Backups = nil
	o.ExistingDexConfig = []byte("staticClients: " + secretKey)
	if _, err := Render(o); err == nil || strings.Contains(err.Error(), secretKey) {
		t.Errorf("a malformed dex config: %v", err)
	}
}

func TestComponentsRefuses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"no pins", func(o *Options) { o.Pinned = nil }, "no pinned versions"},
		{"no kip version", func(o *Options) { o.KipVersion = "" }, "no kip version"},
		{"unknown storage", func(o *Options) { o.Sizing.Storage = "nfs" }, `unknown storage "nfs"`},
		{"not a name", func(o *Options) { o.ServerAddress = "server_1" }, `server address "server_1" is not an IPv4 address or a DNS name`},
		{"IPv6", func(o *Options) { o.ServerAddress = "2001:db8::1" }, "is not an IPv4 address"},
		{"bad email", func(o *Options) { o.AdminEmail = "Admin <admin@example.com>" }, "is not an email address"},
		{"no profile", func(o *Options) { o.Sizing.Profile = cluster.Profile{} }, "no profile"},
		{"unpinned chart", func(o *Options) { o.Pinned = &manifests.Versions{} }, `versions.yaml pins no component "traefik"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t, "nano", cluster.StorageLocal)
			tt.mutate(&o)
			_, err := Render(o)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "install components: ") {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestComponentsGolden shows a whole rendered set: small on Longhorn, in-cluster backups,
// monitoring. Secret values and the Dex config's hash (which covers generated IDs) are redacted.
// go test ./internal/install -run Golden -update rewrites it.
func TestComponentsGolden(t *testing.T) {
	var b bytes.Buffer
	for _, c := range renderComponents(t, testOptions(t, "small", cluster.StorageLonghorn)) {
		b.WriteString("# ==== " + c.Name + " " + c.Version + " (namespaces: " + strings.Join(c.Namespaces, ", ") + ")\n")
		for _, part := range []struct {
			what string
			objs []*unstructured.Unstructured
		}{{"objects", c.Objects}, {"create-only", c.CreateOnly}, {"after", c.After}} {
			for _, o := range part.objs {
				o = o.DeepCopy()
				if o.GetKind() == "Secret" {
					for k := range o.Object["data"].(map[string]any) {
						o.Object["data"].(map[string]any)[k] = "<redacted>"
					}
				}
				if o.GetKind() == "CustomResourceDefinition" {
					o.Object["spec"] = "<manifests/crds>"
				}
				y, err := yaml.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				b.WriteString("--- # " + part.what + "\n")
				b.Write(y)
			}
		}
	}
	got := regexp.MustCompile(`kipper\.run/config-sha256: [0-9a-f]{64}`).ReplaceAll(b.Bytes(), []byte("kipper.run/config-sha256: <redacted>"))
	path := filepath.Join("testdata", "components-small-longhorn.golden")
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("rendered components differ from %s (run with -update and review the diff)", path)
	}
}

func TestRolloutStatusRejectsOtherKinds(t *testing.T) {
	if _, _, err := kube.RolloutStatus(&corev1.Pod{}); err == nil {
		t.Error("RolloutStatus accepted a Pod")
	}
}

func TestFirstDifference(t *testing.T) {
	want := map[string]any{"metadata": map[string]any{"name": "x", "annotations": map[string]any{"a": "1"}}, "value": "false",
		"list": []any{map[string]any{"k": "v"}}}
	live := map[string]any{"metadata": map[string]any{"name": "x", "uid": "u", "annotations": map[string]any{"a": "1", "b": "2"}}, "value": "false",
		"list": []any{map[string]any{"k": "v", "extra": true}}, "status": map[string]any{}}
	if d := firstDifference(want, live, ""); d != "" {
		t.Errorf("a superset differs at %s", d)
	}
	live["value"] = "true"
	if d := firstDifference(want, live, ""); d != ".value" {
		t.Errorf("difference at %q, want .value", d)
	}
	live["value"] = "false"
	delete(live["metadata"].(map[string]any)["annotations"].(map[string]any), "a")
	if d := firstDifference(want, live, ""); d != ".metadata.annotations.a" {
		t.Errorf("difference at %q, want .metadata.annotations.a", d)
	}
}

func TestSettingHolds(t *testing.T) {
	for _, c := range []struct {
		pinned, stored string
		holds          bool
	}{
		{"false", "false", true},
		{"false", `{"v1":"false","v2":"false"}`, true},
		{"false", `{"v1":"false","v2":"true"}`, false},
		{"false", "true", false},
		{"false", `{}`, false},
		{"disabled", "disabled", true},
		{"12", `{"v1":"12"}`, true},
	} {
		if got := SettingHolds(c.pinned, c.stored); got != c.holds {
			t.Errorf("SettingHolds(%q, %q) = %v, want %v", c.pinned, c.stored, got, c.holds)
		}
	}
}
