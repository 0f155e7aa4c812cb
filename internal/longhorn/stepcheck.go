package longhorn

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
)

// Longhorn's resources, read unstructured: kip's typed client is one release's and drops the
// fields of others.
var (
	engineImagesGVR = schema.GroupVersionResource{Group: "longhorn.io", Version: "v1beta2", Resource: "engineimages"}
	volumesGVR      = schema.GroupVersionResource{Group: "longhorn.io", Version: "v1beta2", Resource: "volumes"}
	enginesGVR      = schema.GroupVersionResource{Group: "longhorn.io", Version: "v1beta2", Resource: "engines"}
)

// CRDSelector finds Longhorn's CRDs, as Longhorn's documentation does.
const CRDSelector = "app.kubernetes.io/name=longhorn"

// CheckStep is what keeps the step onto next from starting, of spec 002's step 1 that the
// cluster's objects answer: every node on next's Kubernetes floor, every engine in use driven
// by next (its engine API at least next's minimum), before a release without v1beta1 no
// Longhorn CRD still storing it, and no volume faulted or stuck attaching, no replica
// rebuilding, no node out of service. Each blocker is one sentence that says what to do; none
// when the step may start.
func CheckStep(ctx context.Context, cl *kube.Clients, next Release) ([]string, error) {
	var out []string
	nodes, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the cluster's nodes: %w", err)
	}
	floor := version.MustParseGeneric(next.KubernetesFloor)
	for _, n := range nodes.Items {
		kv := n.Status.NodeInfo.KubeletVersion
		if v, err := version.ParseGeneric(kv); err == nil && v.LessThan(floor) {
			out = append(out, fmt.Sprintf("node %s runs Kubernetes %s; Longhorn %s needs %s or later on every node: move k3s first with kip upgrade --k3s", n.Name, kv, next.Version, floorName(floor)))
		}
		if cluster.NodeStatus(&n) == cluster.NodeOutOfService {
			out = append(out, fmt.Sprintf("node %s is marked out of service and runs no instance manager: bring it back with kip node add, or remove it with kip node remove %s --force", n.Name, n.Name))
		}
	}
	images, err := cl.Dynamic.Resource(engineImagesGVR).Namespace(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Longhorn's engine images: %w", err)
	}
	for _, ei := range images.Items {
		refs, _, _ := unstructured.NestedInt64(ei.Object, "status", "refCount")
		cliAPI, _, _ := unstructured.NestedInt64(ei.Object, "status", "cliAPIVersion")
		ctl, _, _ := unstructured.NestedInt64(ei.Object, "status", "controllerAPIVersion")
		if refs > 0 && (cliAPI < int64(next.CLIAPIMin) || ctl < int64(next.ControllerAPIMin)) {
			image, _, _ := unstructured.NestedString(ei.Object, "spec", "image")
			out = append(out, fmt.Sprintf("engine image %s (%s), which %d %s use, has engine API %d and controller API %d; Longhorn %s drives engines from %d and %d: move those volumes onto a newer engine first",
				ei.GetName(), image, refs, cli.Plural(int(refs), "volume", "volumes"), cliAPI, ctl, next.Version, next.CLIAPIMin, next.ControllerAPIMin))
		}
	}
	if next.V1beta1 == V1beta1Removed {
		crds, err := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{LabelSelector: CRDSelector})
		if err != nil {
			return nil, fmt.Errorf("list Longhorn's CRDs: %w", err)
		}
		var stored []string
		for _, c := range crds.Items {
			if slices.Contains(c.Status.StoredVersions, "v1beta1") {
				stored = append(stored, c.Name)
			}
		}
		if len(stored) > 0 {
			sort.Strings(stored)
			out = append(out, fmt.Sprintf("Longhorn %s removes longhorn.io/v1beta1, which %s still %s: migrate them as the Longhorn v1.10.0 release notes describe first",
				next.Version, strings.Join(stored, ", "), cli.Plural(len(stored), "stores", "store")))
		}
	}
	unsettled, err := unsettledVolumes(ctx, cl)
	if err != nil {
		return nil, err
	}
	return append(out, unsettled...), nil
}

// unsettledVolumes names the volumes that keep a step from starting: faulted, stuck attaching,
// or with a replica rebuilding (the engine's replica in mode WO).
func unsettledVolumes(ctx context.Context, cl *kube.Clients) ([]string, error) {
	vols, err := cl.Dynamic.Resource(volumesGVR).Namespace(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Longhorn's volumes: %w", err)
	}
	var out []string
	for _, v := range vols.Items {
		robustness, _, _ := unstructured.NestedString(v.Object, "status", "robustness")
		state, _, _ := unstructured.NestedString(v.Object, "status", "state")
		switch {
		case robustness == "faulted":
			out = append(out, fmt.Sprintf("volume %s is faulted: recover its data before moving Longhorn", v.GetName()))
		case state == "attaching":
			out = append(out, fmt.Sprintf("volume %s is attaching: wait until it is attached, or find why it is stuck", v.GetName()))
		}
	}
	engines, err := cl.Dynamic.Resource(enginesGVR).Namespace(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Longhorn's engines: %w", err)
	}
	for _, e := range engines.Items {
		modes, _, _ := unstructured.NestedStringMap(e.Object, "status", "replicaModeMap")
		var rebuilding []string
		for replica, mode := range modes {
			if mode == "WO" {
				rebuilding = append(rebuilding, replica)
			}
		}
		if len(rebuilding) > 0 {
			sort.Strings(rebuilding)
			vol, _, _ := unstructured.NestedString(e.Object, "spec", "volumeName")
			out = append(out, fmt.Sprintf("volume %s is rebuilding %s: wait until it is healthy", vol, strings.Join(rebuilding, ", ")))
		}
	}
	return out, nil
}

// floorName is a Kubernetes floor as people write it: v1.34.
func floorName(v *version.Version) string { return fmt.Sprintf("v%d.%d", v.Major(), v.Minor()) }
