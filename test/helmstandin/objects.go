package helmstandin

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// CertManagerFixture is a chart fixture of cert-manager's chart (its <fixtures>/cert-manager/*.yaml):
// it stands in for cert-manager's CRDs, which are not in kip's module graph, with a ClusterIssuer
// CRD that accepts any ClusterIssuer.
const CertManagerFixture = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusterissuers.cert-manager.io
spec:
  group: cert-manager.io
  names: {kind: ClusterIssuer, listKind: ClusterIssuerList, plural: clusterissuers, singular: clusterissuer}
  scope: Cluster
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// Applier applies objects server-side, finding each kind's resource through discovery.
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// NewApplier returns an Applier writing through dyn and finding kinds through disc.
func NewApplier(dyn dynamic.Interface, disc discovery.DiscoveryInterface) *Applier {
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

// Resource returns where o lives; a namespaced object without a namespace goes to ns.
func (a *Applier) Resource(o *unstructured.Unstructured, ns string) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset() // a kind from a CRD created since discovery was read
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
	}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return a.dyn.Resource(mapping.Resource), nil
	}
	if o.GetNamespace() == "" {
		o.SetNamespace(ns)
	}
	return a.dyn.Resource(mapping.Resource).Namespace(o.GetNamespace()), nil
}

// Apply applies o with manager, taking conflicts.
func (a *Applier) Apply(ctx context.Context, o *unstructured.Unstructured, ns, manager string) error {
	res, err := a.Resource(o, ns)
	if err != nil {
		return err
	}
	if _, err := res.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: manager, Force: true}); err != nil {
		return fmt.Errorf("apply %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	return nil
}

// ReadObjects reads the objects of a YAML or JSON file with one or more documents; a List's
// items are objects of their own.
func ReadObjects(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return DecodeObjects(f)
}

// DecodeObjects reads objects as ReadObjects does.
func DecodeObjects(in io.Reader) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := yaml.NewYAMLReader(bufio.NewReader(in))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		data, err := yaml.ToJSON(doc)
		if err != nil {
			return nil, err
		}
		if data = bytes.TrimSpace(data); len(data) == 0 || string(data) == "null" {
			continue // an empty document
		}
		obj, _, err := unstructured.UnstructuredJSONScheme.Decode(data, nil, nil)
		if err != nil {
			return nil, err
		}
		switch o := obj.(type) {
		case *unstructured.Unstructured:
			objs = append(objs, o)
		case *unstructured.UnstructuredList:
			for i := range o.Items {
				objs = append(objs, &o.Items[i])
			}
		}
	}
}
