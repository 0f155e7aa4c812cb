package components

import (
	"fmt"
	"slices"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/manifests"
)

// What the catalogue tells readers of a cluster (kip platform versions): the system namespaces,
// the charts and the App CRD's kip version, all from Render rather than from second lists.

// AppCRD is the App CustomResourceDefinition, on which kip records the kip version that last
// wrote the Kipper schemas (KipVersionAnnotation).
const AppCRD = "apps.kipper.run"

// catalogueAddress stands in for a server address when rendering the catalogue: TEST-NET-1, never
// reached, since the catalogue is never applied.
const catalogueAddress = "192.0.2.1"

// Catalogue is every component a Kipper cluster can have, whatever its storage, backups and
// monitoring: Render for a Longhorn cluster on the largest profile with in-cluster backups (MinIO
// and Velero) and Prometheus and Loki on. It is read, never applied: the secrets it generates and
// its placeholder address are thrown away.
func Catalogue(pinned *manifests.Versions) ([]Component, error) {
	return Render(Options{
		Sizing:        cluster.Sizing{Profile: cluster.Profiles[len(cluster.Profiles)-1], Storage: cluster.StorageLonghorn},
		Monitoring:    cluster.Monitoring{Prometheus: true, Loki: true},
		ServerAddress: catalogueAddress,
		Pinned:        pinned,
		KipVersion:    "catalogue",
	})
}

// SystemNamespaces are Kipper's system namespaces: where cs's workloads run, in install order,
// then HelmChartNamespace.
func SystemNamespaces(cs []Component) []string {
	var out []string
	for _, c := range cs {
		for _, ns := range c.Namespaces {
			if !slices.Contains(out, ns) {
				out = append(out, ns)
			}
		}
	}
	if !slices.Contains(out, HelmChartNamespace) {
		out = append(out, HelmChartNamespace)
	}
	return out
}

// Chart is a component's Helm chart as its HelmChart asks k3s's helm-controller to install it.
type Chart struct {
	// Component is the component's name.
	Component string
	// Release is the Helm release's name: the HelmChart's, in HelmChartNamespace.
	Release string
	// Namespace is the release's namespace, where Helm keeps its state (the Secrets
	// sh.helm.release.v1.<release>.v<revision>): the HelmChart's targetNamespace.
	Namespace string
	// Chart, Version and Repo are the chart, its pinned version and its repository.
	Chart, Version, Repo string
}

// Charts returns the charts of cs, in install order.
func Charts(cs []Component) ([]Chart, error) {
	var out []Chart
	for _, c := range cs {
		for _, obj := range c.Objects {
			if obj.GetKind() != "HelmChart" || obj.GroupVersionKind().Group != helmv1.SchemeGroupVersion.Group {
				continue
			}
			var hc helmv1.HelmChart
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &hc); err != nil {
				return nil, fmt.Errorf("%s: HelmChart %s: %w", c.Name, obj.GetName(), err)
			}
			ns := hc.Spec.TargetNamespace
			if ns == "" {
				ns = hc.Namespace
			}
			out = append(out, Chart{Component: c.Name, Release: hc.Name, Namespace: ns,
				Chart: hc.Spec.Chart, Version: hc.Spec.Version, Repo: hc.Spec.Repo})
		}
	}
	return out, nil
}
