package components

import (
	"context"
	"fmt"
	"reflect"
	"sort"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kipper.run/kip/internal/kube"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

var (
	helmChartGK = schema.GroupKind{Group: helmv1.SchemeGroupVersion.Group, Kind: "HelmChart"}
	crdGK       = schema.GroupKind{Group: apiextensionsv1.GroupName, Kind: "CustomResourceDefinition"}
)

// Status reports whether c is installed and rolled out, and when it is not, what is pending:
//   - for each HelmChart among Objects, k3s's helm-controller's Job helm-install-<name> in the
//     chart's namespace exists, installs the chart's spec.version (its VERSION) and is Complete
//     (a Failed Job is not ready, and pending says why);
//   - CRDs among Objects are Established;
//   - kip's own Deployments, DaemonSets and StatefulSets among Objects have rolled out;
//   - for a chart component, every Deployment, DaemonSet and StatefulSet in Namespaces has rolled
//     out, except those of another Helm release (MinIO's in Velero's namespace);
//   - After objects are present as rendered.
//
// An error is an API error other than not-found, or a rollout that waiting cannot finish.
func (c Component) Status(ctx context.Context, cl *kube.Clients) (ready bool, pending string, err error) {
	return c.StatusFrom(ReadListed(ctx, cl, []Component{c}))
}

func isWorkloadKind(kind string) bool {
	return kind == "Deployment" || kind == "DaemonSet" || kind == "StatefulSet"
}

func jobEnv(job *batchv1.Job, name string) string {
	for _, c := range job.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}

// firstDifference returns the path of the first field of want that live lacks or holds
// differently, or "". Lists must have want's length, and their items want's fields.
func firstDifference(want, live any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			return orRoot(path)
		}
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if d := firstDifference(w[k], l[k], path+"."+k); d != "" {
				return d
			}
		}
		return ""
	case []any:
		l, ok := live.([]any)
		if !ok || len(l) != len(w) {
			return orRoot(path)
		}
		for i := range w {
			if d := firstDifference(w[i], l[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(want, live) {
			return orRoot(path)
		}
		return ""
	}
}

func orRoot(path string) string {
	if path == "" {
		return "."
	}
	return path
}
