package backup

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/service"
)

// veleroRestoredPod is a Postgres service's pod as Velero's restore item actions hand it to the
// resource modifiers: its restore-wait init container first, mounting each volume with a
// file-system backup at /restores/<volume>.
func veleroRestoredPod() *corev1.Pod {
	claim := func(name, claim string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
	}
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: "shop-prod", Labels: map[string]string{service.Label: "db"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db", UID: "4f1c"}}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "kipper-db",
			Volumes: []corev1.Volume{claim("data", "data-db-0"), claim("dump", "dump-db-0"),
				{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db-tls"}}}},
			InitContainers: []corev1.Container{
				{Name: restoreWait, Image: "velero/velero:v1.18.3", Args: []string{"7d2e"},
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/restores/data"}, {Name: "dump", MountPath: "/restores/dump"}}},
				{Name: "fix-permissions", Image: "postgres:17-alpine", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}},
			},
			Containers: []corev1.Container{{Name: "postgres", Image: "postgres:17-alpine",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "dump", MountPath: "/dump"}, {Name: "tls", MountPath: "/tls"}}}},
		},
	}
}

func dumpTestPlan() *dumpPlan {
	return &dumpPlan{
		svc:    &service.Service{Ref: service.Ref{Project: "shop", Environment: "prod", Name: "db"}, Type: "postgres"},
		backup: &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "shop-20261206-020000"}},
		pod:    "db-0", dump: "dump", others: []string{"data"},
		bytes: 300 << 20, image: "postgres:17-alpine", inits: []string{"fix-permissions"}, scratch: dumpScratchName("shop-prod", "db"),
	}
}

// TestDumpModifier applies the resource modifier's pod patch with Kubernetes' strategic merge
// patch, as Velero's resource modifiers do, to the pod as Velero restores it: only the dump
// volume is left for Velero to restore, and the pod runs the scratch database and the check.
func TestDumpModifier(t *testing.T) {
	p := dumpTestPlan()
	text, err := p.modifier()
	if err != nil {
		t.Fatal(err)
	}
	var mods struct {
		Version string `json:"version"`
		Rules   []struct {
			Conditions struct {
				GroupResource     string   `json:"groupResource"`
				Namespaces        []string `json:"namespaces"`
				ResourceNameRegex string   `json:"resourceNameRegex"`
			} `json:"conditions"`
			StrategicPatches []struct {
				PatchData string `json:"patchData"`
			} `json:"strategicPatches"`
			MergePatches []struct {
				PatchData string `json:"patchData"`
			} `json:"mergePatches"`
		} `json:"resourceModifierRules"`
	}
	if err := yaml.UnmarshalStrict([]byte(text), &mods); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if mods.Version != "v1" || len(mods.Rules) != 3 {
		t.Fatalf("want version v1 and three rules:\n%s", text)
	}
	podRule := mods.Rules[0]
	// Velero matches the rules before it maps the namespace: they name the service's.
	if c := podRule.Conditions; c.GroupResource != "pods" || len(c.Namespaces) != 1 || c.Namespaces[0] != "shop-prod" ||
		!regexp.MustCompile(c.ResourceNameRegex).MatchString("db-0") || regexp.MustCompile(c.ResourceNameRegex).MatchString("db-01") {
		t.Errorf("pod rule conditions %+v", c)
	}
	// The claims as Velero restores them without their volumes: each still names the service's
	// own volume. Every rule that matches applies, in order.
	for claim, want := range map[string]string{"data-db-0": dumpNoVolume, "dump-db-0": "", "kip-move-db": dumpNoVolume} {
		pvc := corev1.PersistentVolumeClaim{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
			ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: "shop-prod"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pvc-live-" + claim}}
		doc := must(json.Marshal(pvc))
		for _, r := range mods.Rules[1:] {
			c := r.Conditions
			if c.GroupResource != "persistentvolumeclaims" || len(c.Namespaces) != 1 || c.Namespaces[0] != "shop-prod" || len(r.MergePatches) != 1 {
				t.Fatalf("claim rule %+v", r)
			}
			if c.ResourceNameRegex != "" && !regexp.MustCompile(c.ResourceNameRegex).MatchString(claim) {
				continue
			}
			if doc, err = jsonpatch.MergePatch(doc, []byte(r.MergePatches[0].PatchData)); err != nil {
				t.Fatal(err)
			}
		}
		var got corev1.PersistentVolumeClaim
		if err := json.Unmarshal(doc, &got); err != nil {
			t.Fatal(err)
		}
		if got.Spec.VolumeName != want {
			t.Errorf("claim %s names volume %q, want %q", claim, got.Spec.VolumeName, want)
		}
	}
	if len(podRule.StrategicPatches) != 1 {
		t.Fatalf("pod rule %+v", podRule)
	}
	orig, err := json.Marshal(veleroRestoredPod())
	if err != nil {
		t.Fatal(err)
	}
	out, err := strategicpatch.StrategicMergePatch(orig, []byte(podRule.StrategicPatches[0].PatchData), corev1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(out, &pod); err != nil {
		t.Fatal(err)
	}
	if len(pod.OwnerReferences) != 0 || pod.Spec.ServiceAccountName != "default" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever ||
		pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("pod metadata and spec: owners %v, service account %q, restart %q, automount %v", pod.OwnerReferences,
			pod.Spec.ServiceAccountName, pod.Spec.RestartPolicy, pod.Spec.AutomountServiceAccountToken)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	if len(vols) != 3 || vols["data"].DownwardAPI == nil || vols["data"].PersistentVolumeClaim != nil ||
		vols["dump"].PersistentVolumeClaim == nil || vols["dump"].PersistentVolumeClaim.ClaimName != "dump-db-0" || vols["dump"].PersistentVolumeClaim.ReadOnly ||
		vols[dumpScratchVolume].EmptyDir == nil || vols[dumpScratchVolume].EmptyDir.SizeLimit.String() != "2400Mi" {
		t.Errorf("volumes %+v: want data an empty downward-API volume, dump its claim (writable: Velero restores into it), the scratch volume 8 × 300 MiB, and no other", pod.Spec.Volumes)
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != restoreWait || pod.Spec.InitContainers[0].Image != "velero/velero:v1.18.3" ||
		len(pod.Spec.InitContainers[0].Args) != 1 || len(pod.Spec.InitContainers[0].VolumeMounts) != 1 ||
		pod.Spec.InitContainers[0].VolumeMounts[0].MountPath != "/restores/dump" {
		t.Errorf("init containers %+v: want Velero's restore-wait alone, waiting for the dump volume alone", pod.Spec.InitContainers)
	}
	if len(pod.Spec.Containers) != 2 || pod.Spec.Containers[0].Name != dumpDBContainer || pod.Spec.Containers[1].Name != dumpCheckContainer {
		t.Fatalf("containers %+v", pod.Spec.Containers)
	}
	for _, c := range pod.Spec.Containers {
		if c.Image != "postgres:17-alpine" || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("container %s: image %s, limits %v", c.Name, c.Image, c.Resources.Limits)
		}
		for _, m := range c.VolumeMounts {
			if _, ok := vols[m.Name]; !ok || m.Name == "data" {
				t.Errorf("container %s mounts %s", c.Name, m.Name)
			}
		}
	}
}

func TestDumpScratchName(t *testing.T) {
	if got := dumpScratchName("shop-prod", "db"); got != "shop-prod-db-dump" {
		t.Errorf("scratch namespace %s", got)
	}
	if got := dumpScratchName(strings.Repeat("p", 50)+"-prod", strings.Repeat("d", 20)); len(got) > 63 || strings.HasSuffix(got, "-") {
		t.Errorf("long scratch namespace %s (%d)", got, len(got))
	}
}

func TestParseDumpReport(t *testing.T) {
	log := "archive 1796515200 4096 /dump/app-2026-12-06.dump\n" +
		"table\tpublic\torders\t1204\ntable\tshop\titems\t0\ndone\n"
	rep, err := parseDumpReport(log, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := DumpReport{Archive: "app-2026-12-06.dump", Bytes: 4096, Written: time.Unix(1796515200, 0).UTC(), Rows: 1204,
		Tables: []DumpTable{{"public", "orders", 1204}, {"shop", "items", 0}}}
	if got, _ := json.Marshal(rep); string(got) != string(must(json.Marshal(want))) {
		t.Errorf("report %s\nwant %s", got, must(json.Marshal(want)))
	}
	for _, c := range []struct {
		log  string
		code int32
		want string
	}{
		{"no-archive 2\n", 3, "holds no pg_dump archive (of 2 files on it"},
		{"archive 1 2 /dump/a.dump\npg_restore: error: could not execute query: ERROR:  extension \"postgis\" is not available\n", 1,
			`loading a.dump into a scratch database failed (exit code 1): pg_restore: error: could not execute query: ERROR:  extension "postgis" is not available`},
		{"archive 1 2 /dump/a.dump\ntable\tpublic\tt\t1\n", 0, "loading a.dump into a scratch database failed (exit code 0): none"},
		{"archive x 2 /dump/a.dump\n", 0, "unreadable"},
	} {
		if _, err := parseDumpReport(c.log, c.code); err == nil || !strings.Contains(err.Error(), c.want) {
			if c.want == "unreadable" && err != nil && strings.Contains(err.Error(), "invalid syntax") {
				continue
			}
			t.Errorf("parseDumpReport(%q, %d) = %v; want %q", c.log, c.code, err, c.want)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
