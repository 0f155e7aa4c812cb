package longhorn

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/test/testenv"
)

// TestSaveObjects: a step's copy of Longhorn's objects, from a real API server: one YAML list
// per kind in a directory only its owner reads, each holding the objects as the API serves
// them (a volume's spec and status, a setting's value).
func TestSaveObjects(t *testing.T) {
	_, cl, ctx := longhornTestEnv(t)
	lh := cl.Longhorn.LonghornV1beta2()
	v, err := lh.Volumes(Namespace).Create(ctx, &longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: "save-vol", Namespace: Namespace}, Spec: testenv.LonghornVolumeSpec(1<<30, 2)}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lh.Volumes(Namespace).Delete(context.Background(), v.Name, metav1.DeleteOptions{}) })
	v.Status.State, v.Status.Robustness = longhornv1beta2.VolumeStateAttached, longhornv1beta2.VolumeRobustnessHealthy
	if _, err := lh.Volumes(Namespace).UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := lh.Settings(Namespace).Create(ctx, &longhornv1beta2.Setting{ObjectMeta: metav1.ObjectMeta{Name: "save-setting", Namespace: Namespace}, Value: "42"}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lh.Settings(Namespace).Delete(context.Background(), s.Name, metav1.DeleteOptions{}) })

	dir := filepath.Join(t.TempDir(), "longhorn-upgrades", "prod", "to-v1.11.3")
	files, err := SaveObjects(ctx, cl, dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the directory: %v, %v", fi, err)
	}
	if len(files) != 4 {
		t.Fatalf("files %q", files)
	}
	read := func(name string) []any {
		t.Helper()
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v", name, fi, err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var list map[string]any
		if err := yaml.Unmarshal(data, &list); err != nil {
			t.Fatal(err)
		}
		items, _ := list["items"].([]any)
		return items
	}
	find := func(items []any, name string) map[string]any {
		for _, it := range items {
			if o, ok := it.(map[string]any); ok && (&unstructured.Unstructured{Object: o}).GetName() == name {
				return o
			}
		}
		t.Fatalf("no %s among %d items", name, len(items))
		return nil
	}
	vol := find(read("volumes.yaml"), "save-vol")
	if got, _, _ := unstructured.NestedFieldNoCopy(vol, "spec", "numberOfReplicas"); fmt.Sprint(got) != "2" {
		t.Errorf("the saved volume's copies: %v", got)
	}
	if got, _, _ := unstructured.NestedString(vol, "status", "robustness"); got != "healthy" {
		t.Errorf("the saved volume's robustness: %q", got)
	}
	if got, _, _ := unstructured.NestedString(find(read("settings.yaml"), "save-setting"), "value"); got != "42" {
		t.Errorf("the saved setting: %q", got)
	}
	for _, f := range []string{"replicas.yaml", "engines.yaml"} {
		read(f)
	}
	if !strings.HasSuffix(files[0], "volumes.yaml") {
		t.Errorf("files %q", files)
	}
}
