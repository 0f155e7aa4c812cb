package standin

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/test/testenv"
)

// TestMain shares one API test environment among this package's tests.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestReleaseCRDs: each release's CRDs against a real API server, as a cluster moves through
// them. 1.8's serve longhorn.io/v1beta1 (not as the storage version) and carry the label
// Longhorn's documentation finds them by; 1.9's list it unserved. A cluster that once stored
// volumes as v1beta1 (its CRD's status.storedVersions lists it) keeps that through 1.8 and 1.9:
// kip's step check names the CRD, and the API server refuses 1.10's CRDs, which no longer list
// v1beta1, until the stored versions are migrated (Longhorn v1.10.0's release notes); then
// 1.10's apply and v1beta1 is gone.
func TestReleaseCRDs(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	apply := func(release string, edit func(*unstructured.Unstructured)) error {
		t.Helper()
		data, err := ReleaseCRDs(release)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := kube.DecodeManifests(data)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) != 22 {
			t.Fatalf("%s: %d CRDs, want Longhorn's 22", release, len(objs))
		}
		for _, o := range objs {
			if o.GetLabels()["app.kubernetes.io/name"] != "longhorn" || o.GetLabels()["app.kubernetes.io/version"] != release {
				t.Errorf("%s: CRD %s labelled %v", release, o.GetName(), o.GetLabels())
			}
			if edit != nil {
				edit(o)
			}
		}
		return kube.Apply(ctx, cl, objs, kube.ApplyOptions{FieldManager: "longhorn-chart", Force: true})
	}
	v1beta1Volumes := schema.GroupVersionResource{Group: "longhorn.io", Version: "v1beta1", Resource: "volumes"}
	// served waits until the API server serves v1beta1 volumes or not, as want says (its
	// discovery follows a CRD's change).
	served := func(want bool) error {
		t.Helper()
		return kube.Poll(ctx, 30*time.Second, "longhorn.io/v1beta1 volumes served: "+fmt.Sprint(want), func(ctx context.Context) (bool, string, error) {
			_, err := cl.Dynamic.Resource(v1beta1Volumes).Namespace(Namespace).List(ctx, metav1.ListOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return false, "", err
			}
			return (err == nil) == want, fmt.Sprint(err), nil
		})
	}
	crds := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions()
	stored := func() []string {
		t.Helper()
		c, err := crds.Get(ctx, "volumes.longhorn.io", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Status.StoredVersions
	}

	if err := apply("v1.8.2", nil); err != nil {
		t.Fatal(err)
	}
	if err := served(true); err != nil {
		t.Errorf("1.8.2's CRDs: %v", err)
	}
	// A cluster that began before v1beta2: its volumes were stored as v1beta1 once.
	if err := apply("v1.8.2", func(o *unstructured.Unstructured) {
		if o.GetName() != "volumes.longhorn.io" {
			return
		}
		versions, _, _ := unstructured.NestedSlice(o.Object, "spec", "versions")
		for _, v := range versions {
			m := v.(map[string]any)
			m["storage"] = m["name"] == "v1beta1"
		}
		_ = unstructured.SetNestedSlice(o.Object, versions, "spec", "versions")
	}); err != nil {
		t.Fatal(err)
	}
	if err := apply("v1.9.2", nil); err != nil {
		t.Fatal(err)
	}
	if err := served(false); err != nil {
		t.Errorf("1.9.2's CRDs: %v", err)
	}
	if got := stored(); !slices.Contains(got, "v1beta1") {
		t.Fatalf("volumes' stored versions %v lack v1beta1", got)
	}
	r10, _ := longhorn.LadderRelease("v1.10.2")
	blockers, err := longhorn.CheckStep(ctx, cl, r10)
	if err != nil {
		t.Fatal(err)
	}
	if all := strings.Join(blockers, "\n"); !strings.Contains(all, "volumes.longhorn.io still stores") {
		t.Errorf("kip's step check does not name volumes.longhorn.io:\n%s", all)
	}
	err = apply("v1.10.2", nil)
	if err == nil || !strings.Contains(err.Error(), "storedVersions") {
		t.Fatalf("1.10.2's CRDs over a v1beta1 stored version: %v, want the API server's refusal", err)
	}
	// The migration: every object rewritten as v1beta2 (none here), then v1beta1 dropped from the
	// stored versions.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // the CRD's controllers write its status too
		c, err := crds.Get(ctx, "volumes.longhorn.io", metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Status.StoredVersions = []string{"v1beta2"}
		_, err = crds.UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := apply("v1.10.2", nil); err != nil {
		t.Fatalf("1.10.2's CRDs after the migration: %v", err)
	}
	if got := stored(); !slices.Equal(got, []string{"v1beta2"}) {
		t.Errorf("volumes' stored versions after 1.10.2: %v", got)
	}
}
