package kube

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Drift reports which of objs are not in the cluster as a server-side apply of them (by
// fieldManager, "kip" when empty) would leave them: missing, or different from what the server
// says the apply would store. It asks the server with a dry-run apply of each object, so the
// answer takes defaults, admission and other managers' fields into account, and changes nothing.
// Objects are described as "Kind namespace/name: missing", "…: differs" or "…: changed by
// another field manager" (a field the apply sets was last set by someone else: applying takes it
// back only with ApplyOptions.Force).
func Drift(ctx context.Context, c *Clients, objs []*unstructured.Unstructured, fieldManager string) ([]string, error) {
	if fieldManager == "" {
		fieldManager = defaultFieldManager
	}
	a := &applier{c: c, opts: ApplyOptions{FieldManager: fieldManager, DryRun: true}}
	var drift []string
	for _, o := range objs {
		mapping, err := a.mapping(ctx, o.GroupVersionKind())
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", describe(o), err)
		}
		ri, obj, err := a.resource(mapping, o)
		if err != nil {
			return nil, err
		}
		live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			drift = append(drift, describe(o)+": missing")
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", describe(o), err)
		}
		want, err := a.applyObject(ctx, o)
		var conflict *conflictError
		if errors.As(err, &conflict) {
			drift = append(drift, describe(o)+": changed by another field manager")
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("check: %w", err)
		}
		if !sameStored(live, want) {
			drift = append(drift, describe(o)+": differs")
		}
	}
	return drift, nil
}

// sameStored compares two versions of an object as stored, ignoring the bookkeeping a no-op
// apply may still touch.
func sameStored(a, b *unstructured.Unstructured) bool {
	strip := func(u *unstructured.Unstructured) map[string]any {
		u = u.DeepCopy()
		u.SetManagedFields(nil)
		u.SetResourceVersion("")
		return u.Object
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
}
