package kube_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

func TestDecodeManifests(t *testing.T) {
	data := `# a leading comment
---
apiVersion: v1
kind: ConfigMap
metadata: {name: one, namespace: ns}
data: {replicas: "2"}
---
---
# only a comment
---
{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "two"}}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: three}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: four}
  spec: {replicas: 2}
`
	objs, err := kube.DecodeManifests([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+"/"+o.GetName())
	}
	if want := "ConfigMap/one Secret/two Service/three Deployment/four"; strings.Join(got, " ") != want {
		t.Errorf("decoded %v, want %s", got, want)
	}
	if n, ok, err := unstructured.NestedInt64(objs[3].Object, "spec", "replicas"); !ok || err != nil || n != 2 {
		t.Errorf("replicas decoded as %v (%v, %v), want int64 2", objs[3].Object["spec"], ok, err)
	}

	for _, tt := range []struct{ name, data, want string }{
		{"no kind", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nmetadata: {name: b}\n", "decode manifests: document 2: v1 object has no kind"},
		{"no apiVersion", "kind: ConfigMap\nmetadata: {name: a}\n", "decode manifests: document 1: ConfigMap has no apiVersion"},
		{"neither", "---\nmetadata: {name: a}\n---\n", "decode manifests: document 1: no apiVersion and no kind"},
		{"list item", "apiVersion: v1\nkind: List\nitems:\n- kind: Pod\n", "decode manifests: document 1, item 1: Pod has no apiVersion"},
		{"not an object", "- a\n- b\n", "decode manifests: document 1: not an object"},
		{"bad yaml", "apiVersion: v1\nkind: [\n", "decode manifests: document 1:"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := kube.DecodeManifests([]byte(tt.data))
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func clients(t *testing.T) (*kube.Clients, *testenv.Env) {
	t.Helper()
	env := testenv.Get(t)
	c, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c, env
}

func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// bundle is a CRD, a Namespace, objects in it (one a custom resource of the CRD) and a
// cluster-scoped object, in an order Apply must fix (the CR and ConfigMap before their CRD and
// Namespace).
func bundle(group, ns string) string {
	return fmt.Sprintf(`apiVersion: %[1]s/v1
kind: Widget
metadata: {name: w1, namespace: %[2]s}
spec: {size: 3}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: %[2]s}
data: {mode: fast}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: %[2]s-reader}
rules:
- apiGroups: [%[1]q]
  resources: [widgets]
  verbs: [get, list]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.%[1]s}
spec:
  group: %[1]s
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
---
apiVersion: v1
kind: Namespace
metadata:
  name: %[2]s
  # An object of which the applier owns no field gets no managedFields entry at creation, so the
  # next apply records the fields as "before-first-apply" and bumps resourceVersion once.
  labels: {app.kubernetes.io/part-of: kipper}
`, group, ns)
}

func TestApplyBundleIsIdempotent(t *testing.T) {
	c, _ := clients(t)
	ctx := context.Background()
	suffix := randomSuffix()
	group, ns := "t"+suffix+".test.kipper.run", "apply-"+suffix
	objs, err := kube.DecodeManifests([]byte(bundle(group, ns)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		_ = c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), "widgets."+group, metav1.DeleteOptions{})
		_ = c.Kube.RbacV1().ClusterRoles().Delete(context.Background(), ns+"-reader", metav1.DeleteOptions{})
	})
	if err := kube.Apply(ctx, c, objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	widgets := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "widgets"}
	versions := func() map[string]string {
		t.Helper()
		m := map[string]string{}
		w, err := c.Dynamic.Resource(widgets).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m["widget"] = w.GetResourceVersion()
		cm, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "settings", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m["configmap"] = cm.ResourceVersion
		for _, mf := range cm.ManagedFields {
			if mf.Manager != "kip" || mf.Operation != metav1.ManagedFieldsOperationApply {
				t.Errorf("configmap field manager %s %s, want kip Apply", mf.Manager, mf.Operation)
			}
		}
		cr, err := c.Kube.RbacV1().ClusterRoles().Get(ctx, ns+"-reader", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m["clusterrole"] = cr.ResourceVersion
		nsObj, err := c.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m["namespace"] = nsObj.ResourceVersion
		crd, err := c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "widgets."+group, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m["crd"] = crd.ResourceVersion
		return m
	}
	first := versions()

	// The same bundle again, decoded afresh: nothing changes on the server.
	objs, _ = kube.DecodeManifests([]byte(bundle(group, ns)))
	if err := kube.Apply(ctx, c, objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	second := versions()
	for k, v := range first {
		if second[k] != v {
			t.Errorf("%s resourceVersion %s became %s on a no-op apply", k, v, second[k])
		}
	}

	// A real change does change it.
	objs, _ = kube.DecodeManifests([]byte(strings.Replace(bundle(group, ns), "size: 3", "size: 4", 1)))
	if err := kube.Apply(ctx, c, objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := c.Dynamic.Resource(widgets).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size, _, _ := unstructured.NestedInt64(w.Object, "spec", "size"); size != 4 || w.GetResourceVersion() == first["widget"] {
		t.Errorf("widget size %d resourceVersion %s after change", size, w.GetResourceVersion())
	}
}

func configMap(ns, name, value string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"data":       map[string]any{"value": value},
	}}
}

func TestApplyConflictAndForce(t *testing.T) {
	c, env := clients(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	if err := kube.Apply(ctx, c, []*unstructured.Unstructured{configMap(ns, "owned", "1")}, kube.ApplyOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	err := kube.Apply(ctx, c, []*unstructured.Unstructured{configMap(ns, "owned", "2")}, kube.ApplyOptions{})
	if err == nil {
		t.Fatal("apply over another manager's field succeeded without force")
	}
	want := fmt.Sprintf(`apply ConfigMap %s/owned: fields owned by another field manager: .data.value (conflict with "helm"); apply with force to take them over`, ns)
	if err.Error() != want {
		t.Errorf("conflict error:\n got %s\nwant %s", err, want)
	}
	if !apierrors.IsConflict(err) {
		t.Errorf("conflict error does not unwrap to a 409: %#v", err)
	}
	if err := kube.Apply(ctx, c, []*unstructured.Unstructured{configMap(ns, "owned", "2")}, kube.ApplyOptions{Force: true}); err != nil {
		t.Fatalf("forced apply: %v", err)
	}
	cm, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "owned", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["value"] != "2" {
		t.Errorf("value %q after forced apply, want 2", cm.Data["value"])
	}
}

func TestApplyDryRunChangesNothing(t *testing.T) {
	c, env := clients(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	if err := kube.Apply(ctx, c, []*unstructured.Unstructured{configMap(ns, "existing", "1")}, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	before, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "existing", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dry := []*unstructured.Unstructured{configMap(ns, "existing", "2"), configMap(ns, "new", "1")}
	if err := kube.Apply(ctx, c, dry, kube.ApplyOptions{DryRun: true}); err != nil {
		t.Fatal(err)
	}
	after, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "existing", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Data["value"] != "1" || after.ResourceVersion != before.ResourceVersion {
		t.Errorf("dry run changed the object: value %q resourceVersion %s → %s", after.Data["value"], before.ResourceVersion, after.ResourceVersion)
	}
	if _, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "new", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("dry run created an object: %v", err)
	}
	// The server still validates in a dry run.
	bad := configMap(ns, "Not_A_Name", "1")
	if err := kube.Apply(ctx, c, []*unstructured.Unstructured{bad}, kube.ApplyOptions{DryRun: true}); !apierrors.IsInvalid(err) {
		t.Errorf("dry run of an invalid object: %v, want 422 Invalid", err)
	}

	// A bundle whose CRD and Namespace do not exist yet dry-runs without error and leaves no trace.
	suffix := randomSuffix()
	group, newNS := "d"+suffix+".test.kipper.run", "dry-"+suffix
	objs, err := kube.DecodeManifests([]byte(bundle(group, newNS)))
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.Apply(ctx, c, objs, kube.ApplyOptions{DryRun: true}); err != nil {
		t.Fatalf("dry run of a new bundle: %v", err)
	}
	if _, err := c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "widgets."+group, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("dry run created the CRD: %v", err)
	}
	if _, err := c.Kube.CoreV1().Namespaces().Get(ctx, newNS, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("dry run created the namespace: %v", err)
	}
}

func TestApplyRefusesIncompleteObjects(t *testing.T) {
	c, _ := clients(t)
	ctx := context.Background()
	noNS := configMap("", "x", "1")
	err := kube.Apply(ctx, c, []*unstructured.Unstructured{noNS}, kube.ApplyOptions{})
	if err == nil || err.Error() != "apply ConfigMap x: ConfigMap is namespaced and the object has no metadata.namespace" {
		t.Errorf("err = %v", err)
	}
	noName := configMap("default", "", "1")
	if err := kube.Apply(ctx, c, []*unstructured.Unstructured{noName}, kube.ApplyOptions{}); err == nil || !strings.Contains(err.Error(), "no metadata.name") {
		t.Errorf("err = %v", err)
	}
	unknown := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "nothing.example.com/v1", "kind": "Gadget", "metadata": map[string]any{"name": "g"}}}
	err = kube.Apply(ctx, c, []*unstructured.Unstructured{unknown}, kube.ApplyOptions{})
	if err == nil || !strings.HasPrefix(err.Error(), "apply Gadget g: no matches for kind \"Gadget\" in version \"nothing.example.com/v1\"") {
		t.Errorf("err = %v", err)
	}
	if errors.Is(err, context.Canceled) {
		t.Error("unexpected cancel")
	}
}
