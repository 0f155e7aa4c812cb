package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Drift reports which of objs are not in the cluster as a server-side apply of them (by
// fieldManager, "kip" when empty) would leave them: missing, or holding in the fields the apply
// sets something other than what the server says the apply would store. It asks the server with a dry-run apply of each object, so the
// answer takes defaults, admission and other managers' fields into account, and changes nothing.
// Objects are described as "Kind namespace/name: missing", "…: differs" or "…: changed by
// another field manager" (a field the apply sets was last set by someone else: applying takes it
// back only with ApplyOptions.Force).
func Drift(ctx context.Context, c *Clients, objs []*unstructured.Unstructured, fieldManager string) ([]string, error) {
	if fieldManager == "" {
		fieldManager = FieldManager
	}
	var drift []string
	for _, o := range objs {
		live, want, err := Preview(ctx, c, o, ApplyOptions{FieldManager: fieldManager})
		var conflict *conflictError
		switch {
		case errors.As(err, &conflict):
			drift = append(drift, describe(o)+": changed by another field manager")
			continue
		case err != nil:
			return nil, err
		case live == nil:
			drift = append(drift, describe(o)+": missing")
			continue
		}
		same, err := sameStored(live, want, fieldManager)
		if err != nil {
			return nil, err
		}
		if !same {
			drift = append(drift, describe(o)+": differs")
		}
	}
	return drift, nil
}

// Preview returns o as the cluster stores it (live) and as a server-side apply of it with opts
// would store it (planned), from a dry run of that apply: both nil when o does not exist. The
// planned object's generation tells whether the apply would change what its controller acts on.
// A field another manager set makes it fail unless opts.Force, as the apply would.
func Preview(ctx context.Context, c *Clients, o *unstructured.Unstructured, opts ApplyOptions) (live, planned *unstructured.Unstructured, err error) {
	if opts.FieldManager == "" {
		opts.FieldManager = FieldManager
	}
	opts.DryRun = true
	a := &applier{c: c, opts: opts}
	mapping, err := a.mapping(ctx, o.GroupVersionKind())
	if err != nil {
		return nil, nil, fmt.Errorf("check %s: %w", describe(o), err)
	}
	ri, obj, err := a.resource(mapping, o)
	if err != nil {
		return nil, nil, err
	}
	live, err = ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("check %s: %w", describe(o), err)
	}
	planned, err = a.applyObject(ctx, o)
	if err != nil {
		return nil, nil, fmt.Errorf("check: %w", err)
	}
	return live, planned, nil
}

// sameStored reports whether live already holds what want (the server's dry run of kip's
// apply) says kip's fields should hold. Only the fields that fieldManager owns in want are
// compared: other managers' fields, the status and the bookkeeping that controllers change
// between two reads are not kip's business.
func sameStored(live, want *unstructured.Unstructured, fieldManager string) (bool, error) {
	for _, mf := range want.GetManagedFields() {
		if mf.Manager != fieldManager || mf.Operation != metav1.ManagedFieldsOperationApply || mf.Subresource != "" || mf.FieldsV1 == nil {
			continue
		}
		var fields map[string]any
		if err := json.Unmarshal(mf.FieldsV1.Raw, &fields); err != nil {
			return false, fmt.Errorf("managed fields of %s: %w", describe(want), err)
		}
		return ownedEqual(fields, live.Object, want.Object)
	}
	return true, nil // the apply sets no field beyond the object's identity
}

// ownedEqual compares live and want at the paths of a managed-fields set (FieldsV1: "f:name" a
// field, "k:{...}" a list element by its keys, "v:..." a set element, "i:N" an index; an empty
// set is a whole value).
func ownedEqual(fields map[string]any, live, want any) (bool, error) {
	for key, sub := range fields {
		if key == "." {
			continue
		}
		subFields, _ := sub.(map[string]any)
		var lv, wv any
		var lok, wok bool
		switch {
		case strings.HasPrefix(key, "f:"):
			lm, _ := live.(map[string]any)
			wm, _ := want.(map[string]any)
			lv, lok = lm[key[2:]]
			wv, wok = wm[key[2:]]
		case strings.HasPrefix(key, "k:"):
			var keys map[string]any
			if err := json.Unmarshal([]byte(key[2:]), &keys); err != nil {
				return false, fmt.Errorf("managed fields key %s: %w", key, err)
			}
			lv, lok = elementWithKeys(live, keys)
			wv, wok = elementWithKeys(want, keys)
		case strings.HasPrefix(key, "v:"):
			var v any
			if err := json.Unmarshal([]byte(key[2:]), &v); err != nil {
				return false, fmt.Errorf("managed fields value %s: %w", key, err)
			}
			lok = slices.ContainsFunc(asList(live), func(e any) bool { return equality.Semantic.DeepEqual(e, v) })
			wok = slices.ContainsFunc(asList(want), func(e any) bool { return equality.Semantic.DeepEqual(e, v) })
			if lok != wok {
				return false, nil
			}
			continue
		case strings.HasPrefix(key, "i:"):
			i, err := strconv.Atoi(key[2:])
			if err != nil {
				return false, fmt.Errorf("managed fields index %s: %w", key, err)
			}
			ll, wl := asList(live), asList(want)
			if lok = i < len(ll); lok {
				lv = ll[i]
			}
			if wok = i < len(wl); wok {
				wv = wl[i]
			}
		default:
			return false, fmt.Errorf("managed fields: unknown path element %q", key)
		}
		if lok != wok {
			return false, nil
		}
		if len(subFields) == 0 || len(subFields) == 1 && subFields["."] != nil {
			if !equality.Semantic.DeepEqual(lv, wv) {
				return false, nil
			}
			continue
		}
		if ok, err := ownedEqual(subFields, lv, wv); !ok || err != nil {
			return false, err
		}
	}
	return true, nil
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// elementWithKeys finds the list element whose fields equal keys.
func elementWithKeys(list any, keys map[string]any) (any, bool) {
	for _, e := range asList(list) {
		m, ok := e.(map[string]any)
		if !ok {
			continue
		}
		match := true
		for k, v := range keys {
			if !equality.Semantic.DeepEqual(normalizeNumber(m[k]), normalizeNumber(v)) {
				match = false
				break
			}
		}
		if match {
			return e, true
		}
	}
	return nil, false
}

// normalizeNumber makes JSON numbers comparable whether decoded as int64 or float64.
func normalizeNumber(v any) any {
	switch n := v.(type) {
	case int64:
		return float64(n)
	case int:
		return float64(n)
	}
	return v
}
