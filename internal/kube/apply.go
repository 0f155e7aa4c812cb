package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// ApplyOptions tune Apply.
type ApplyOptions struct {
	// FieldManager owns the applied fields; "kip" when empty.
	FieldManager string
	// Force takes over fields another field manager owns instead of failing on the conflict.
	Force bool
	// DryRun has the API server validate and admit every object without storing it.
	DryRun bool
}

const (
	// FieldManager is the field manager of kip's applies and writes.
	FieldManager = "kip"
	// crdEstablishTimeout bounds the wait between applying a bundle's CRDs and its custom
	// resources.
	crdEstablishTimeout = 2 * time.Minute
)

var crdGroupKind = schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}

// Apply server-side applies objs. CustomResourceDefinitions go first and are waited for until
// Established, then Namespaces, then the rest in the order given, so one bundle can carry a CRD,
// the namespace and the custom resources that use them. It stops at the first object that fails.
//
// A conflict with another field manager fails naming the fields and their owners, unless Force.
// With DryRun nothing is stored; objects that depend on a CRD or Namespace the same bundle would
// create cannot be checked by the server and are left out.
func Apply(ctx context.Context, c *Clients, objs []*unstructured.Unstructured, opts ApplyOptions) error {
	if opts.FieldManager == "" {
		opts.FieldManager = FieldManager
	}
	var crds, namespaces, others []*unstructured.Unstructured
	for _, o := range objs {
		switch gk := o.GroupVersionKind().GroupKind(); {
		case gk == crdGroupKind:
			crds = append(crds, o)
		case gk == schema.GroupKind{Kind: "Namespace"}:
			namespaces = append(namespaces, o)
		default:
			others = append(others, o)
		}
	}
	a := &applier{c: c, opts: opts, newKinds: map[schema.GroupKind]bool{}, newNamespaces: map[string]bool{}}
	var crdNames []string
	for _, o := range crds {
		if err := a.apply(ctx, o); err != nil {
			return err
		}
		crdNames = append(crdNames, o.GetName())
		group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
		a.newKinds[schema.GroupKind{Group: group, Kind: kind}] = true
	}
	if len(crds) > 0 && !opts.DryRun {
		if err := WaitCRDsEstablished(ctx, c, crdNames, crdEstablishTimeout); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		resetMapper(c.Mapper)
	}
	for _, o := range namespaces {
		if err := a.apply(ctx, o); err != nil {
			return err
		}
		a.newNamespaces[o.GetName()] = true
	}
	for _, o := range others {
		if err := a.apply(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

type applier struct {
	c             *Clients
	opts          ApplyOptions
	newKinds      map[schema.GroupKind]bool // defined by the bundle's CRDs
	newNamespaces map[string]bool           // created by the bundle
}

func (a *applier) apply(ctx context.Context, o *unstructured.Unstructured) error {
	_, err := a.applyObject(ctx, o)
	return err
}

// applyObject applies o and returns what the server stored (or, in a dry run, would store); nil
// when a dry run could not check it because its CRD or namespace is only in the bundle.
func (a *applier) applyObject(ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := o.GroupVersionKind()
	desc := describe(o)
	if gvk.Kind == "" || gvk.Version == "" {
		return nil, fmt.Errorf("apply %s: object has no apiVersion or kind", desc)
	}
	if o.GetName() == "" {
		return nil, fmt.Errorf("apply %s: object has no metadata.name", desc)
	}
	mapping, err := a.mapping(ctx, gvk)
	if err != nil {
		if a.opts.DryRun && meta.IsNoMatchError(err) && a.newKinds[gvk.GroupKind()] {
			return nil, nil // its CRD is only in the bundle: the server cannot check it yet
		}
		return nil, fmt.Errorf("apply %s: %w", desc, err)
	}
	ri, obj, err := a.resource(mapping, o)
	if err != nil {
		return nil, err
	}
	ao := metav1.ApplyOptions{FieldManager: a.opts.FieldManager, Force: a.opts.Force}
	if a.opts.DryRun {
		ao.DryRun = []string{metav1.DryRunAll}
	}
	out, err := ri.Apply(ctx, o.GetName(), obj, ao)
	if err != nil {
		if a.opts.DryRun && apierrors.IsNotFound(err) && a.newNamespaces[o.GetNamespace()] {
			return nil, nil // its namespace is only in the bundle
		}
		if conflicts := conflictsOf(err); len(conflicts) > 0 {
			return nil, &conflictError{obj: desc, conflicts: conflicts, err: err}
		}
		return nil, fmt.Errorf("apply %s: %w", desc, err)
	}
	return out, nil
}

// ResourceFor returns the dynamic client for o's resource (in o's namespace when the kind is
// namespaced), and o as the server wants it.
func ResourceFor(ctx context.Context, c *Clients, o *unstructured.Unstructured) (dynamic.ResourceInterface, *unstructured.Unstructured, error) {
	a := &applier{c: c}
	m, err := a.mapping(ctx, o.GroupVersionKind())
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", describe(o), err)
	}
	return a.resource(m, o)
}

// resource returns the client for o's resource, and o as the server wants it (a cluster-scoped
// object without a namespace).
func (a *applier) resource(mapping *meta.RESTMapping, o *unstructured.Unstructured) (dynamic.ResourceInterface, *unstructured.Unstructured, error) {
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			return nil, nil, fmt.Errorf("apply %s: %s is namespaced and the object has no metadata.namespace", describe(o), o.GetKind())
		}
		return a.c.Dynamic.Resource(mapping.Resource).Namespace(o.GetNamespace()), o, nil
	}
	if o.GetNamespace() != "" {
		o = o.DeepCopy()
		o.SetNamespace("")
	}
	return a.c.Dynamic.Resource(mapping.Resource), o, nil
}

// mapping finds gvk's resource. An unknown kind resets the discovery cache; one that a CRD of the
// bundle defines is retried a while, as discovery can trail the CRD's Established condition.
func (a *applier) mapping(ctx context.Context, gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	deadline := time.Now().Add(30 * time.Second)
	reset := false
	for {
		m, err := a.c.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil || !meta.IsNoMatchError(err) {
			return m, err
		}
		if reset && (!a.newKinds[gvk.GroupKind()] || a.opts.DryRun || time.Now().After(deadline)) {
			return nil, err
		}
		if reset {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
		resetMapper(a.c.Mapper)
		reset = true
	}
}

func resetMapper(m meta.RESTMapper) {
	if r, ok := m.(meta.ResettableRESTMapper); ok {
		r.Reset()
	}
}

// describe names an object as "Kind namespace/name" (or "Kind name").
func describe(o *unstructured.Unstructured) string {
	kind := o.GetKind()
	if kind == "" {
		kind = "object"
	}
	name := o.GetName()
	if name == "" {
		name = "(unnamed)"
	}
	if ns := o.GetNamespace(); ns != "" {
		return kind + " " + ns + "/" + name
	}
	return kind + " " + name
}

// conflictError is a server-side apply conflict: fields of the object that another field manager
// owns. It unwraps to the API server's 409 Conflict.
type conflictError struct {
	obj       string
	conflicts []metav1.StatusCause
	err       error
}

func (e *conflictError) Error() string {
	parts := make([]string, 0, len(e.conflicts))
	for _, c := range e.conflicts {
		parts = append(parts, fmt.Sprintf("%s (%s)", c.Field, c.Message))
	}
	return fmt.Sprintf("apply %s: fields owned by another field manager: %s; apply with force to take them over",
		e.obj, strings.Join(parts, ", "))
}

func (e *conflictError) Unwrap() error { return e.err }

func conflictsOf(err error) []metav1.StatusCause {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Reason != metav1.StatusReasonConflict || status.Status().Details == nil {
		return nil
	}
	var out []metav1.StatusCause
	for _, c := range status.Status().Details.Causes {
		if c.Type == metav1.CauseTypeFieldManagerConflict {
			out = append(out, c)
		}
	}
	return out
}

// DecodeManifests decodes multi-document YAML (or JSON) into objects, in order. Empty documents
// are skipped, a List's items are taken one by one, and a document without apiVersion or kind is
// an error naming its position (counting from 1).
func DecodeManifests(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode manifests: document %d: %w", i, err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("decode manifests: document %d: %w", i, err)
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			continue
		}
		var m map[string]any
		if err := utiljson.Unmarshal(js, &m); err != nil {
			return nil, fmt.Errorf("decode manifests: document %d: not an object: %w", i, err)
		}
		u := &unstructured.Unstructured{Object: m}
		if err := checkType(u); err != nil {
			return nil, fmt.Errorf("decode manifests: document %d: %w", i, err)
		}
		if items, ok := m["items"].([]any); ok && strings.HasSuffix(u.GetKind(), "List") {
			for j, it := range items {
				im, ok := it.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("decode manifests: document %d, item %d: not an object", i, j+1)
				}
				item := &unstructured.Unstructured{Object: im}
				if err := checkType(item); err != nil {
					return nil, fmt.Errorf("decode manifests: document %d, item %d: %w", i, j+1, err)
				}
				objs = append(objs, item)
			}
			continue
		}
		objs = append(objs, u)
	}
}

func checkType(u *unstructured.Unstructured) error {
	switch {
	case u.GetAPIVersion() == "" && u.GetKind() == "":
		return errors.New("no apiVersion and no kind")
	case u.GetAPIVersion() == "":
		return fmt.Errorf("%s has no apiVersion", u.GetKind())
	case u.GetKind() == "":
		return fmt.Errorf("%s object has no kind", u.GetAPIVersion())
	}
	return nil
}
