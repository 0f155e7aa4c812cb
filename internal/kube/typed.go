package kube

import (
	"context"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// ListAs lists resource gvr in namespace ("" for every namespace, or a cluster-scoped resource)
// in one request and converts each item to T, a typed object of Scheme (Velero's, Longhorn's).
func ListAs[T any](ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, namespace string, opts metav1.ListOptions) ([]T, error) {
	list, err := dyn.Resource(gvr).Namespace(namespace).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(list.Items))
	for i := range list.Items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &out[i]); err != nil {
			return nil, fmt.Errorf("decode %s %s: %w", gvr.Resource, list.Items[i].GetName(), err)
		}
	}
	return out, nil
}

// GetAs reads one object of resource gvr and converts it to T.
func GetAs[T any](ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, namespace, name string) (*T, error) {
	u, err := dyn.Resource(gvr).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &out); err != nil {
		return nil, fmt.Errorf("decode %s %s: %w", gvr.Resource, name, err)
	}
	return &out, nil
}

// CreateAs converts obj, a typed object of Scheme with its apiVersion and kind set, and creates it.
func CreateAs[T any](ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, namespace string, obj *T) (*T, error) {
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", gvr.Resource, err)
	}
	u, err := dyn.Resource(gvr).Namespace(namespace).Create(ctx, &unstructured.Unstructured{Object: raw}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	var out T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &out); err != nil {
		return nil, fmt.Errorf("decode %s %s: %w", gvr.Resource, u.GetName(), err)
	}
	return &out, nil
}

// Names lists the names of the objects of resource gvr in namespace, sorted.
func Names(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, namespace string) ([]string, error) {
	list, err := dyn.Resource(gvr).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list %s in %s: %w", gvr.Resource, namespace, err)
	}
	names := make([]string, 0, len(list.Items))
	for _, o := range list.Items {
		names = append(names, o.GetName())
	}
	slices.Sort(names)
	return names, nil
}
