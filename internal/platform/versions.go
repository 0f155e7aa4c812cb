// Package platform is kip platform: what the cluster runs and the optional components on it.
// docs/platform.md describes its commands and their JSON.
package platform

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	"golang.org/x/sync/errgroup"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/manifests"
)

// ConsoleAPIBuildConfigMap is where console-api records its build when it starts: the ConfigMap
// console-api-build in kipper-system, with the data keys version, commit, startedAt (RFC 3339)
// and pod (the pod that wrote it). console-api is not part of kip; docs/platform.md documents
// this contract, and kip only reads it.
const (
	ConsoleAPIBuildNamespace = "kipper-system"
	ConsoleAPIBuildConfigMap = "console-api-build"
)

// VersionsOptions configure Versions. cmd/kip wires them.
type VersionsOptions struct {
	// JSON writes the report as JSON (-o json) rather than text.
	JSON bool
	// Out receives the report.
	Out io.Writer
	// Kube returns the cluster's API clients.
	Kube func() (*kube.Clients, error)
	// KipVersion is this kip's version.
	KipVersion string
}

// VersionsReport is the documented shape of 'kip platform versions -o json' (docs/platform.md).
type VersionsReport struct {
	Kip        KipVersions     `json:"kip"`
	ConsoleAPI ConsoleAPIBuild `json:"consoleAPI"`
	// PinnedK3s is the k3s release this kip pins, which every node should run.
	PinnedK3s string         `json:"pinnedK3s"`
	Nodes     []NodeVersion  `json:"nodes"`
	Charts    []ChartVersion `json:"charts"`
	// Namespaces are Kipper's system namespaces, whose workloads Workloads lists.
	Namespaces []string   `json:"namespaces"`
	Workloads  []Workload `json:"workloads"`
	// Warnings are what needs attention, each in one sentence.
	Warnings []string `json:"warnings"`
}

// KipVersions are the kip recorded on the cluster and the one running.
type KipVersions struct {
	// Recorded is kipper.run/kip-version on the App CRD (apps.kipper.run): the kip that last
	// wrote the Kipper schemas. "" when the CRD or its annotation is missing.
	Recorded string `json:"recorded"`
	// Running is the version of the kip that made the report.
	Running string `json:"running"`
}

// ConsoleAPIBuild is the build console-api recorded when it started (ConsoleAPIBuildConfigMap).
type ConsoleAPIBuild struct {
	// Recorded is false when console-api has recorded no build: the other fields are then empty.
	Recorded  bool   `json:"recorded"`
	Version   string `json:"version,omitempty"`
	Commit    string `json:"commit,omitempty"`
	StartedAt string `json:"startedAt,omitempty"`
	Pod       string `json:"pod,omitempty"`
}

// NodeVersion is one node's Kubernetes version, as its kubelet reports it.
type NodeVersion struct {
	Name string `json:"name"`
	// Role is server (the control plane) or worker.
	Role string `json:"role"`
	// Kubernetes is the kubelet's version: k3s's release on a k3s node (v1.37.2+k3s1).
	Kubernetes       string `json:"kubernetes"`
	ContainerRuntime string `json:"containerRuntime,omitempty"`
	OSImage          string `json:"osImage,omitempty"`
}

// Chart states: how a chart's Helm release compares with what this kip pins.
const (
	// ChartOK: the latest revision is deployed at the pinned chart version.
	ChartOK = "ok"
	// ChartDiffers: the latest revision is deployed at another chart version.
	ChartDiffers = "differs"
	// ChartFailed: the latest revision's status is failed.
	ChartFailed = "failed"
	// ChartPending: a Helm operation is under way on the release (pending-install,
	// pending-upgrade, pending-rollback, uninstalling), or was interrupted and blocks the next one.
	ChartPending = "pending"
	// ChartNoRelease: the cluster has the component's HelmChart but Helm has no release of it yet.
	ChartNoRelease = "no-release"
	// ChartNotInstalled: the cluster has neither the HelmChart nor a release: a component this
	// cluster does not run (Longhorn on local storage, monitoring turned off).
	ChartNotInstalled = "not-installed"
	// ChartOther: the latest revision is superseded, uninstalled or unknown.
	ChartOther = "other"
	// ChartError: the release could not be read; Error says why.
	ChartError = "error"
)

// ChartVersion is one component's chart: what this kip pins, what the HelmChart on the cluster
// asks for, and what Helm installed, from the release state k3s's helm-controller leaves (Helm's
// Secrets sh.helm.release.v1.<release>.v<revision> in the release's namespace).
type ChartVersion struct {
	Component string `json:"component"`
	// Release is the Helm release's name (the HelmChart's, in kube-system).
	Release string `json:"release"`
	// Namespace is the release's namespace (the HelmChart's targetNamespace).
	Namespace string `json:"namespace"`
	Chart     string `json:"chart"`
	// Pinned is the chart version this kip pins (manifests/versions.yaml).
	Pinned string `json:"pinned"`
	// HelmChart is the HelmChart's spec.version on the cluster: the version kip last asked
	// helm-controller to install. "" when the cluster has no HelmChart for the component.
	HelmChart string `json:"helmChart,omitempty"`
	// Installed, AppVersion, Revision, Status, Description and Updated are the release's latest
	// revision: its chart's version and appVersion, its Helm status (deployed, failed,
	// pending-install, pending-upgrade, pending-rollback, uninstalling, uninstalled, superseded,
	// unknown), Helm's description of it and when it was last deployed. Empty without a release.
	Installed   string     `json:"installed,omitempty"`
	AppVersion  string     `json:"appVersion,omitempty"`
	Revision    int        `json:"revision,omitempty"`
	Status      string     `json:"status,omitempty"`
	Description string     `json:"description,omitempty"`
	Updated     *time.Time `json:"updated,omitempty"`
	// Deployed is the newest deployed revision when the latest revision is not deployed (a
	// failed upgrade leaves the previous revision deployed).
	Deployed *Revision `json:"deployed,omitempty"`
	// State is ok, differs, failed, pending, no-release, not-installed, other or error.
	State string `json:"state"`
	// Fix is the commands that recover a failed release, in order.
	Fix []string `json:"fix,omitempty"`
	// Error says why the release could not be read.
	Error string `json:"error,omitempty"`
}

// Revision is one revision of a Helm release.
type Revision struct {
	Revision int    `json:"revision"`
	Chart    string `json:"chart"`
}

// Workload is a Deployment, StatefulSet or DaemonSet in a system namespace.
type Workload struct {
	Namespace string `json:"namespace"`
	// Kind is Deployment, StatefulSet or DaemonSet.
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Images are its pod template's containers, init containers first.
	Images []Image `json:"images"`
}

// Image is one container of a pod template.
type Image struct {
	Container string `json:"container"`
	Image     string `json:"image"`
	Init      bool   `json:"init,omitempty"`
}

// parallelReads bounds the Helm release reads Versions has in flight at once.
const parallelReads = 8

// Versions reports the versions the cluster runs to o.Out.
func Versions(ctx context.Context, o *VersionsOptions) error {
	r, err := CollectVersions(ctx, o)
	if err != nil {
		return err
	}
	if o.JSON {
		return cli.WriteJSON(o.Out, r)
	}
	return r.WriteText(o.Out)
}

// CollectVersions reads the report: the HelmCharts, the cluster record, the App CRD, the
// console-api ConfigMap, the nodes, one list per workload kind, and one Helm release history per
// chart (at most parallelReads at once).
func CollectVersions(ctx context.Context, o *VersionsOptions) (*VersionsReport, error) {
	c, err := o.Kube()
	if err != nil {
		return nil, err
	}
	pinned, err := manifests.Pinned()
	if err != nil {
		return nil, err
	}
	catalogue, err := components.Catalogue(pinned)
	if err != nil {
		return nil, err
	}
	charts, err := components.Charts(catalogue)
	if err != nil {
		return nil, err
	}
	k3s, err := pinned.Component("k3s")
	if err != nil {
		return nil, err
	}
	r := &VersionsReport{
		Kip:        KipVersions{Running: o.KipVersion},
		PinnedK3s:  k3s.Version,
		Nodes:      []NodeVersion{},
		Charts:     make([]ChartVersion, len(charts)),
		Namespaces: components.SystemNamespaces(catalogue),
		Workloads:  []Workload{},
		Warnings:   []string{},
	}

	// The reads that decide the charts' state and fix come first: the HelmCharts and the server.
	helmCharts, err := listHelmCharts(ctx, c)
	if err != nil {
		return nil, err
	}
	server := "<cluster-host>"
	if rec, found, err := cluster.ReadRecord(ctx, c.Dynamic); err == nil && found && rec.Server != "" {
		server = rec.Server
	}

	var appCRD bool
	if r.Kip.Recorded, appCRD, err = recordedKip(ctx, c); err != nil {
		return nil, err
	}
	if r.ConsoleAPI, err = consoleAPIBuild(ctx, c); err != nil {
		return nil, err
	}
	if r.Nodes, err = nodeVersions(ctx, c); err != nil {
		return nil, err
	}
	if r.Workloads, err = listWorkloads(ctx, c, r.Namespaces); err != nil {
		return nil, err
	}
	// One Helm release history per chart, each its own list request: a few at once.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallelReads)
	for i, ch := range charts {
		g.Go(func() error {
			r.Charts[i] = chartVersion(c, ch, helmCharts, server)
			return gctx.Err()
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	r.Warnings = append(r.Warnings, warnings(r, appCRD)...)
	return r, nil
}

// recordedKip reads the App CRD's kip version; found is false when the cluster has no App CRD.
func recordedKip(ctx context.Context, c *kube.Clients) (version string, found bool, err error) {
	crd, err := c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, components.AppCRD, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read CRD %s: %w", components.AppCRD, err)
	}
	return crd.Annotations[components.KipVersionAnnotation], true, nil
}

func consoleAPIBuild(ctx context.Context, c *kube.Clients) (ConsoleAPIBuild, error) {
	cm, err := c.Kube.CoreV1().ConfigMaps(ConsoleAPIBuildNamespace).Get(ctx, ConsoleAPIBuildConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ConsoleAPIBuild{}, nil
	}
	if err != nil {
		return ConsoleAPIBuild{}, fmt.Errorf("read configmap %s/%s: %w", ConsoleAPIBuildNamespace, ConsoleAPIBuildConfigMap, err)
	}
	b := ConsoleAPIBuild{Version: cm.Data["version"], Commit: cm.Data["commit"], StartedAt: cm.Data["startedAt"], Pod: cm.Data["pod"]}
	b.Recorded = b.Version != "" || b.Commit != ""
	if !b.Recorded {
		return ConsoleAPIBuild{}, nil
	}
	return b, nil
}

func nodeVersions(ctx context.Context, c *kube.Clients) ([]NodeVersion, error) {
	list, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make([]NodeVersion, 0, len(list.Items))
	for i := range list.Items {
		n := &list.Items[i]
		out = append(out, NodeVersion{Name: n.Name, Role: cluster.NodeRole(n), Kubernetes: n.Status.NodeInfo.KubeletVersion,
			ContainerRuntime: n.Status.NodeInfo.ContainerRuntimeVersion, OSImage: n.Status.NodeInfo.OSImage})
	}
	slices.SortFunc(out, func(a, b NodeVersion) int {
		return cmp.Or(cmp.Compare(cluster.RoleOrder(a.Role), cluster.RoleOrder(b.Role)), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

// listHelmCharts returns the HelmCharts in kube-system by name; none on a cluster without
// helm-controller's CRD.
func listHelmCharts(ctx context.Context, c *kube.Clients) (map[string]helmv1.HelmChart, error) {
	gvr := helmv1.SchemeGroupVersion.WithResource("helmcharts")
	list, err := c.Dynamic.Resource(gvr).Namespace(components.HelmChartNamespace).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return map[string]helmv1.HelmChart{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list HelmCharts in %s: %w", components.HelmChartNamespace, err)
	}
	out := make(map[string]helmv1.HelmChart, len(list.Items))
	for _, item := range list.Items {
		var hc helmv1.HelmChart
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &hc); err != nil {
			return nil, fmt.Errorf("HelmChart %s/%s: %w", components.HelmChartNamespace, item.GetName(), err)
		}
		out[hc.Name] = hc
	}
	return out, nil
}

// chartVersion reads ch's release with Helm's own storage driver, as helm-controller's Jobs wrote
// it. (Helm's Secrets driver makes its requests without a context: a stopped kip waits for the
// one in flight.)
func chartVersion(c *kube.Clients, ch components.Chart, helmCharts map[string]helmv1.HelmChart, server string) ChartVersion {
	v := ChartVersion{Component: ch.Component, Release: ch.Release, Namespace: ch.Namespace, Chart: ch.Chart, Pinned: ch.Version}
	hc, hasChart := helmCharts[ch.Release]
	if hasChart {
		v.HelmChart = hc.Spec.Version
		if hc.Spec.TargetNamespace != "" {
			v.Namespace = hc.Spec.TargetNamespace
		}
	}
	store := storage.Init(driver.NewSecrets(c.Kube.CoreV1().Secrets(v.Namespace)))
	history, err := store.History(ch.Release)
	switch {
	case errors.Is(err, driver.ErrReleaseNotFound):
		v.State = ChartNotInstalled
		if hasChart {
			v.State = ChartNoRelease
		}
		return v
	case err != nil:
		v.State, v.Error = ChartError, fmt.Sprintf("read Helm release %s in %s: %v", ch.Release, v.Namespace, err)
		return v
	case len(history) == 0:
		// Helm's driver skips a release Secret it cannot decode.
		v.State, v.Error = ChartError, fmt.Sprintf("Helm release %s in %s: its Secrets (owner=helm,name=%s) cannot be decoded", ch.Release, v.Namespace, ch.Release)
		return v
	}
	slices.SortFunc(history, func(a, b *release.Release) int { return cmp.Compare(b.Version, a.Version) })
	last := history[0]
	v.Revision = last.Version
	if md := chartMetadata(last); md != nil {
		v.Installed, v.AppVersion = md.Version, md.AppVersion
	}
	var status release.Status
	if last.Info != nil {
		status = last.Info.Status
		v.Status, v.Description = status.String(), last.Info.Description
		if t := last.Info.LastDeployed.Time; !t.IsZero() {
			t = t.UTC()
			v.Updated = &t
		}
	}
	if status != release.StatusDeployed {
		for _, h := range history[1:] {
			if h.Info != nil && h.Info.Status == release.StatusDeployed {
				d := &Revision{Revision: h.Version}
				if md := chartMetadata(h); md != nil {
					d.Chart = md.Version
				}
				v.Deployed = d
				break
			}
		}
	}
	switch {
	case status == release.StatusDeployed && sameVersion(v.Installed, v.Pinned):
		v.State = ChartOK
	case status == release.StatusDeployed:
		v.State = ChartDiffers
	case status == release.StatusFailed:
		v.State = ChartFailed
		v.Fix = failedReleaseFix(server, ch.Release, v.Namespace)
	case status.IsPending() || status == release.StatusUninstalling:
		v.State = ChartPending
	default:
		v.State = ChartOther
	}
	return v
}

// FailedReleases returns the charts of cs whose Helm release's latest revision failed, each with
// the recovery docs/platform.md gives (Fix) for the server at server: kip upgrade stops before
// re-applying them, since helm-controller would hang resetting such a release. It reads every
// release Helm keeps in one request, however many charts there are.
func FailedReleases(ctx context.Context, c *kube.Clients, cs []components.Component, server string) ([]ChartVersion, error) {
	charts, err := components.Charts(cs)
	if err != nil {
		return nil, err
	}
	// Helm's Secrets driver makes its request without a context, as in chartVersion.
	all, err := storage.Init(driver.NewSecrets(c.Kube.CoreV1().Secrets(""))).ListReleases()
	if err != nil {
		return nil, fmt.Errorf("read the Helm releases: %w", err)
	}
	latest := map[[2]string]*release.Release{}
	for _, r := range all {
		key := [2]string{r.Namespace, r.Name}
		if l := latest[key]; l == nil || r.Version > l.Version {
			latest[key] = r
		}
	}
	var failed []ChartVersion
	for _, ch := range charts {
		r := latest[[2]string{ch.Namespace, ch.Release}]
		if r == nil || r.Info == nil || r.Info.Status != release.StatusFailed {
			continue
		}
		failed = append(failed, ChartVersion{Component: ch.Component, Release: ch.Release, Namespace: ch.Namespace, Chart: ch.Chart,
			Pinned: ch.Version, Revision: r.Version, Status: r.Info.Status.String(), Description: r.Info.Description,
			State: ChartFailed, Fix: failedReleaseFix(server, ch.Release, ch.Namespace)})
	}
	return failed, nil
}

type metadata struct{ Version, AppVersion string }

func chartMetadata(r *release.Release) *metadata {
	if r.Chart == nil || r.Chart.Metadata == nil {
		return nil
	}
	return &metadata{Version: r.Chart.Metadata.Version, AppVersion: r.Chart.Metadata.AppVersion}
}

// sameVersion compares chart versions with or without a leading v (cert-manager's carry one).
func sameVersion(a, b string) bool {
	return strings.TrimPrefix(a, "v") == strings.TrimPrefix(b, "v")
}

// failedReleaseFix is the recovery docs/platform.md gives for a release in failed state: drop the
// stale release Secrets and let helm-controller install the chart afresh.
func failedReleaseFix(server, name, namespace string) []string {
	return []string{
		"ssh root@" + server,
		"kubectl -n kube-system delete job helm-install-" + name,
		"kubectl -n kube-system delete pods -l helmcharts.helm.cattle.io/chart=" + name + " --force --grace-period=0",
		"kubectl -n " + namespace + " delete secret -l owner=helm,name=" + name,
		"kubectl -n kube-system annotate helmchart " + name + ` kip.kipper/reapply="$(date +%s)" --overwrite`,
	}
}

// listWorkloads lists the Deployments, StatefulSets and DaemonSets in namespaces: one request a
// kind, across the cluster.
func listWorkloads(ctx context.Context, c *kube.Clients, namespaces []string) ([]Workload, error) {
	var out []Workload
	add := func(kind string, meta metav1.ObjectMeta, spec *corev1.PodSpec) {
		if slices.Contains(namespaces, meta.Namespace) {
			out = append(out, Workload{Namespace: meta.Namespace, Kind: kind, Name: meta.Name, Images: images(spec)})
		}
	}
	apps := c.Kube.AppsV1()
	deps, err := apps.Deployments(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Deployments: %w", err)
	}
	for i := range deps.Items {
		add("Deployment", deps.Items[i].ObjectMeta, &deps.Items[i].Spec.Template.Spec)
	}
	stss, err := apps.StatefulSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list StatefulSets: %w", err)
	}
	for i := range stss.Items {
		add("StatefulSet", stss.Items[i].ObjectMeta, &stss.Items[i].Spec.Template.Spec)
	}
	dss, err := apps.DaemonSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list DaemonSets: %w", err)
	}
	for i := range dss.Items {
		add("DaemonSet", dss.Items[i].ObjectMeta, &dss.Items[i].Spec.Template.Spec)
	}
	// In the namespaces' order, then by kind as listed above, then by name.
	kinds := []string{"Deployment", "StatefulSet", "DaemonSet"}
	slices.SortStableFunc(out, func(a, b Workload) int {
		return cmp.Or(cmp.Compare(slices.Index(namespaces, a.Namespace), slices.Index(namespaces, b.Namespace)),
			cmp.Compare(slices.Index(kinds, a.Kind), slices.Index(kinds, b.Kind)), cmp.Compare(a.Name, b.Name))
	})
	if out == nil {
		out = []Workload{}
	}
	return out, nil
}

func images(spec *corev1.PodSpec) []Image {
	out := make([]Image, 0, len(spec.InitContainers)+len(spec.Containers))
	for _, c := range spec.InitContainers {
		out = append(out, Image{Container: c.Name, Image: c.Image, Init: true})
	}
	for _, c := range spec.Containers {
		out = append(out, Image{Container: c.Name, Image: c.Image})
	}
	return out
}

// warnings are the report's findings, each in one sentence.
func warnings(r *VersionsReport, appCRD bool) []string {
	var out []string
	switch {
	case !appCRD:
		out = append(out, fmt.Sprintf("the cluster has no App CRD (%s): kip install has not applied the Kipper schemas", components.AppCRD))
	case r.Kip.Recorded == "":
		out = append(out, fmt.Sprintf("the App CRD %s carries no %s: its schemas were written before kip recorded its version, or not by kip",
			components.AppCRD, components.KipVersionAnnotation))
	}
	for _, n := range r.Nodes {
		if r.PinnedK3s != "" && n.Kubernetes != r.PinnedK3s {
			out = append(out, fmt.Sprintf("node %s runs %s, this kip pins k3s %s", n.Name, cli.OrDash(n.Kubernetes), r.PinnedK3s))
		}
	}
	for _, ch := range r.Charts {
		switch ch.State {
		case ChartFailed:
			out = append(out, fmt.Sprintf("Helm release %s in %s is failed at revision %d: see the fix under Charts", ch.Release, ch.Namespace, ch.Revision))
		case ChartPending:
			out = append(out, fmt.Sprintf("Helm release %s in %s is %s at revision %d: a Helm operation is running, or was interrupted and blocks the next one (kubectl -n kube-system get job helm-install-%s)",
				ch.Release, ch.Namespace, ch.Status, ch.Revision, ch.Release))
		case ChartDiffers:
			out = append(out, fmt.Sprintf("%s runs chart %s %s, this kip pins %s", ch.Component, ch.Chart, ch.Installed, ch.Pinned))
		case ChartNoRelease:
			out = append(out, fmt.Sprintf("%s has a HelmChart but no Helm release in %s yet (kubectl -n kube-system get job helm-install-%s)", ch.Component, ch.Namespace, ch.Release))
		case ChartError:
			out = append(out, ch.Error)
		}
		if ch.HelmChart != "" && !sameVersion(ch.HelmChart, ch.Pinned) {
			out = append(out, fmt.Sprintf("the HelmChart of %s asks for chart %s %s, this kip pins %s", ch.Component, ch.Chart, ch.HelmChart, ch.Pinned))
		}
	}
	return out
}
