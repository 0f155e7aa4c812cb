package components

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestAfterPendingSetting judges a pinned Longhorn setting as Longhorn stores it: the plain value
// kip applies holds in the per-engine form Longhorn's webhook rewrites it to, and only when
// every engine has it; other fields are compared as for any object.
func TestAfterPendingSetting(t *testing.T) {
	setting := func(value string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "longhorn.io/v1beta2", "kind": "Setting",
			"metadata": map[string]any{"name": "fast-replica-rebuild-enabled", "namespace": "longhorn-system"}, "value": value}}
	}
	want := setting("false")
	for _, tt := range []struct {
		live, pending string
	}{
		{"false", ""},
		{`{"v1":"false","v2":"false"}`, ""},
		{`{"v1":"false","v2":"true"}`, "Setting longhorn-system/fast-replica-rebuild-enabled differs from what kip applies at .value"},
		{"true", "Setting longhorn-system/fast-replica-rebuild-enabled differs from what kip applies at .value"},
	} {
		a := &afterList{live: map[string]*unstructured.Unstructured{"fast-replica-rebuild-enabled": setting(tt.live)}}
		if got := afterPendingFrom(want, a); got != tt.pending {
			t.Errorf("live %s: pending %q, want %q", tt.live, got, tt.pending)
		}
	}
	other := setting("false")
	other.SetLabels(map[string]string{"app": "kip"})
	a := &afterList{live: map[string]*unstructured.Unstructured{"fast-replica-rebuild-enabled": setting(`{"v1":"false","v2":"false"}`)}}
	if got := afterPendingFrom(other, a); got != "Setting longhorn-system/fast-replica-rebuild-enabled differs from what kip applies at .metadata.labels" {
		t.Errorf("a missing label: pending %q", got)
	}
	if want.Object["value"] != "false" {
		t.Errorf("the judgement changed the applied object: %v", want.Object)
	}
}
