package components

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

// longhornSettings are the settings kip pins on every Longhorn cluster, by their names in
// longhorn-manager's types/setting.go, with the values the chart's defaultSettings take.
var longhornSettings = []struct {
	name, chartKey string
	value          any
}{
	{"upgrade-checker", "upgradeChecker", false},
	{"allow-collecting-longhorn-usage-metrics", "allowCollectingLonghornUsageMetrics", false},
	// Longhorn issue 14096. A plain "false" applies to both data engines.
	{"fast-replica-rebuild-enabled", "fastReplicaRebuildEnabled", false},
	// A drain waits while Longhorn moves a volume's last healthy copy off the node.
	{"node-drain-policy", "nodeDrainPolicy", "block-for-eviction-if-contains-last-replica"},
	{"default-data-locality", "defaultDataLocality", "disabled"},
	{"replica-auto-balance", "replicaAutoBalance", "disabled"},
	{"rwx-volume-fast-failover", "rwxVolumeFastFailover", false},
	// Pods on a node that goes down are left in place.
	{"node-down-pod-deletion-policy", "nodeDownPodDeletionPolicy", "do-nothing"},
	// A single-node cluster creates volumes that want more copies than it has nodes.
	{"allow-volume-creation-with-degraded-availability", "allowVolumeCreationWithDegradedAvailability", true},
}

// SettingHolds reports whether a Longhorn setting's stored value is the value kip pins. From
// Longhorn 1.10 a data-engine-specific setting is stored per engine: Longhorn's webhook rewrites
// a plain "false" to {"v1":"false","v2":"false"}, so that form holds when every engine's value is
// the pinned one.
func SettingHolds(pinned, stored string) bool {
	if stored == pinned {
		return true
	}
	var perEngine map[string]string
	if err := json.Unmarshal([]byte(stored), &perEngine); err != nil || len(perEngine) == 0 {
		return false
	}
	for _, v := range perEngine {
		if v != pinned {
			return false
		}
	}
	return true
}

// storedAs maps a kind whose API server rewrites what kip applies to the function that turns a
// live object back into what kip applied, when it holds the same (what the After check compares).
var storedAs = map[schema.GroupKind]func(want, live *unstructured.Unstructured) *unstructured.Unstructured{
	{Group: "longhorn.io", Kind: "Setting"}: settingAsApplied,
}

// settingAsApplied is a live Longhorn setting with kip's plain value when its stored value holds
// it (SettingHolds): Longhorn's webhook stores a data-engine-specific setting per engine.
func settingAsApplied(want, live *unstructured.Unstructured) *unstructured.Unstructured {
	w, _, _ := unstructured.NestedString(want.Object, "value")
	l, _, _ := unstructured.NestedString(live.Object, "value")
	if w == l || !SettingHolds(w, l) {
		return live
	}
	out := live.DeepCopy()
	out.Object["value"] = w
	return out
}

// PinnedSettingsPending names the pinned Longhorn settings whose stored value is not kip's, ""
// when every one holds.
func PinnedSettingsPending(ctx context.Context, cl *kube.Clients) (string, error) {
	var off []string
	for _, s := range longhornSettings {
		got, err := cl.Longhorn.LonghornV1beta2().Settings(longhorn.Namespace).Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("read Longhorn setting %s: %w", s.name, err)
		}
		if want := fmt.Sprint(s.value); !SettingHolds(want, got.Value) {
			off = append(off, fmt.Sprintf("%s is %q, not %q", s.name, got.Value, want))
		}
	}
	return strings.Join(off, "; "), nil
}

func (r *renderer) longhorn() (Component, error) {
	defaults := map[string]any{}
	for _, s := range longhornSettings {
		defaults[s.chartKey] = s.value
	}
	// Longhorn's pods run on a worker kip node add holds off ordinary workloads while it checks
	// it: the manager and driver deployer by their chart values, the components Longhorn deploys
	// itself (instance managers, engine images, the CSI plugin) by its taint-toleration setting.
	// That setting can only change while no volume is attached, so kip sets it at install, in
	// the chart's defaults, and does not pin it afterwards.
	defaults["taintToleration"] = cluster.JoiningTaint + ":" + string(corev1.TaintEffectNoSchedule)
	tolerations := []any{map[string]any{"key": cluster.JoiningTaint, "operator": "Exists", "effect": "NoSchedule"}}
	// No backup target, ever: backups go through Velero.
	c, err := r.chartComponent("longhorn", longhorn.Namespace, map[string]any{
		"defaultSettings": defaults,
		"persistence":     map[string]any{"defaultClass": false},
		"longhornManager": map[string]any{"tolerations": tolerations},
		"longhornDriver":  map[string]any{"tolerations": tolerations},
	})
	if err != nil {
		return Component{}, err
	}
	for _, s := range longhornSettings {
		err := collect(&c.After, typed("longhorn.io/v1beta2", "Setting", &longhornv1beta2.Setting{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: longhorn.Namespace},
			Value:      fmt.Sprint(s.value),
		}))
		if err != nil {
			return Component{}, err
		}
	}
	// Longhorn's stock class is not the default: k3s's local-path stays the only default class. The
	// class is Longhorn's (its manager creates it); kip only sets the annotation.
	class := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "storage.k8s.io/v1",
		"kind":       "StorageClass",
		"metadata": map[string]any{
			"name":        longhornClass,
			"annotations": map[string]any{"storageclass.kubernetes.io/is-default-class": "false"},
		},
	}}
	c.After = append(c.After, labelled(class))
	// The class of a service's data moved onto Longhorn (kip service storage longhorn) or created
	// with one copy.
	class1, err := LonghornClass(1)
	if err != nil {
		return Component{}, err
	}
	c.After = append(c.After, class1)
	return c, nil
}

// LonghornClass is the StorageClass of a service's data volume on Longhorn with copies copies
// (cluster.LonghornOneCopyClass, cluster.LonghornTwoCopiesClass): data locality and
// auto-balance off, growable. Longhorn puts each copy on a different node; the one copy of a
// one-copy volume on the server, whose Longhorn node kip tags longhorn.ServerTag (spec 001:
// single-copy volumes are stored on the server).
func LonghornClass(copies int) (*unstructured.Unstructured, error) {
	name := cluster.LonghornOneCopyClass
	params := map[string]string{"numberOfReplicas": fmt.Sprint(copies), "dataLocality": "disabled", "replicaAutoBalance": "disabled", "staleReplicaTimeout": "30"}
	if copies == 2 {
		name = cluster.LonghornTwoCopiesClass
	} else {
		params["nodeSelector"] = longhorn.ServerTag
	}
	u, err := typed("storage.k8s.io/v1", "StorageClass", &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: name},
		Provisioner:          "driver.longhorn.io",
		Parameters:           params,
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		AllowVolumeExpansion: ptr.To(true),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingImmediate),
	})()
	if err != nil {
		return nil, err
	}
	return labelled(u), nil
}
