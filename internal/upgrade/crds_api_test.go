package upgrade

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// TestCheckCRDs runs both CRD guards against a real API server holding this kip's Kipper CRDs:
// they pass as installed; a marker of a newer kip refuses (an older one passes), and a kip built
// from source skips that guard and says so; a CRD whose storedVersions holds a version this
// kip's schema does not declare (objects were stored as v1beta1 by a schema that had it)
// refuses, naming it (the API server would refuse that schema too, mid-way through the CRDs).
func TestCheckCRDs(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	crds := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions()

	if skipped, err := CheckCRDs(ctx, cl, "v0.24.0"); err != nil || skipped != "" {
		t.Fatalf("as installed: skipped %q, %v", skipped, err)
	}
	mark := func(v string) {
		t.Helper()
		patch := `{"metadata":{"annotations":{"` + components.KipVersionAnnotation + `":"` + v + `"}}}`
		if _, err := crds.Patch(ctx, components.AppCRD, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mark("v0.25.0")
	_, err = CheckCRDs(ctx, cl, "v0.24.0")
	if err == nil || !strings.Contains(err.Error(), "the Kipper schemas were last written by kip v0.25.0, newer than this kip (v0.24.0)") ||
		!strings.Contains(err.Error(), "upgrade kip to v0.25.0 or later, then run it again") {
		t.Errorf("a newer kip's marker: %v", err)
	}
	if skipped, err := CheckCRDs(ctx, cl, "v0.24.0-3-gabc1234-dirty"); err != nil || !strings.Contains(skipped, "built from source (version v0.24.0-3-gabc1234-dirty)") ||
		!strings.Contains(skipped, "was skipped") {
		t.Errorf("a kip built from source: skipped %q, %v", skipped, err)
	}
	mark("v0.23.0")
	if skipped, err := CheckCRDs(ctx, cl, "v0.24.0"); err != nil || skipped != "" {
		t.Errorf("an older kip's marker: skipped %q, %v", skipped, err)
	}

	// A schema with a v1beta1 that stores objects (a newer kip's, say), and one stored: this
	// kip's schema declares v1alpha1 alone.
	const name = "functions.kipper.run"
	orig, err := crds.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	beta := orig.DeepCopy()
	v := beta.Spec.Versions[0].DeepCopy()
	v.Name, v.Storage = "v1beta1", true
	beta.Spec.Versions[0].Storage = false
	beta.Spec.Versions = append(beta.Spec.Versions, *v)
	if _, err := crds.Update(ctx, beta, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)
	gvr := schema.GroupVersionResource{Group: "kipper.run", Version: "v1beta1", Resource: "functions"}
	fn := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1beta1", "kind": "Function", "metadata": map[string]any{"name": "f", "namespace": ns}, "spec": map[string]any{}}}
	if err := kube.Poll(ctx, time.Minute, "a function stored as v1beta1", func(ctx context.Context) (bool, string, error) {
		// The API server serves a new version a moment after the CRD's update.
		_, err := cl.Dynamic.Resource(gvr).Namespace(ns).Create(ctx, fn, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	// The tests share one cluster: put the schema back as Kubernetes documents a stored
	// version's removal (the objects stored as v1beta1 gone, storage back on v1alpha1,
	// storedVersions edited). An object left stored as a version no longer served could not be
	// read, nor any namespace holding it deleted.
	t.Cleanup(func() {
		if err := cl.Dynamic.Resource(gvr).Namespace(ns).Delete(context.Background(), "f", metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete the function stored as v1beta1: %v", err)
		}
		restoreCRD(t, cl, orig)
	})
	// The API server itself refuses this kip's schema now (it would drop a stored version), so
	// an upgrade that applied the CRDs one by one would stop half-way: the guard refuses first.
	stored, err := crds.Get(ctx, name, metav1.GetOptions{})
	if err != nil || !slices.Contains(stored.Status.StoredVersions, "v1beta1") {
		t.Fatalf("storedVersions of %s: %v (%v)", name, stored.Status.StoredVersions, err)
	}
	back := stored.DeepCopy()
	back.Spec.Versions = orig.Spec.Versions
	if _, err := crds.Update(ctx, back, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), "v1beta1 was previously a storage version") {
		t.Errorf("the API server took this kip's schema of %s over objects stored as v1beta1: %v", name, err)
	}
	_, err = CheckCRDs(ctx, cl, "v0.24.0")
	if err == nil || !strings.Contains(err.Error(), name+" stores objects as v1beta1, which this kip's schema does not declare (it declares v1alpha1)") ||
		!strings.Contains(err.Error(), "Nothing was changed") {
		t.Errorf("objects stored as v1beta1: %v", err)
	}
}

// restoreCRD puts back orig, a Kipper CRD whose schema a test gave a stored v1beta1.
func restoreCRD(t *testing.T, cl *kube.Clients, orig *apiextensionsv1.CustomResourceDefinition) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	crds := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd, err := crds.Get(ctx, orig.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Storage = crd.Spec.Versions[i].Name == orig.Spec.Versions[0].Name
		}
		if crd, err = crds.Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
			return err
		}
		crd.Status.StoredVersions = []string{orig.Spec.Versions[0].Name}
		if crd, err = crds.UpdateStatus(ctx, crd, metav1.UpdateOptions{}); err != nil {
			return err
		}
		crd.Spec.Versions = orig.Spec.Versions
		_, err = crds.Update(ctx, crd, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Errorf("restore CRD %s: %v", orig.Name, err)
	}
}
