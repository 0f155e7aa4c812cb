package platform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/manifests"
)

// Optional platform components that kip platform enable and disable turn on and off.
const (
	PlatformPrometheus = "prometheus"
	PlatformLoki       = "loki"
)

// monitoringNeeds is the memory a monitoring component asks of the server, checked before it is
// turned on: Prometheus with Grafana and the node exporter, and Loki with its gateway.
var monitoringNeeds = map[string]resource.Quantity{
	PlatformPrometheus: resource.MustParse("1200Mi"),
	PlatformLoki:       resource.MustParse("600Mi"),
}

// Options is what the kip platform commands that read or change the cluster need; cmd/kip
// fills it from the factory.
type Options struct {
	// Kube returns the cluster's API clients.
	Kube     func() (*kube.Clients, error)
	Printer  *cli.Printer
	Prompter *cli.Prompter
	// Holder is the command line, which the cluster lock and the progress record name.
	Holder     string
	KipVersion string
	// JSON and Out are kip platform profile show's output (-o json).
	JSON bool
	Out  io.Writer
}

// MonitoringOptions are kip platform enable and disable's.
type MonitoringOptions struct {
	Options
	Component string // PlatformPrometheus or PlatformLoki
	On        bool   // enable
}

// ProfileOptions are kip platform profile set's.
type ProfileOptions struct {
	Options
	Profile string
}

// platform is what the kip platform commands act on: the cluster, its record and components.
type platform struct {
	o      Options
	p      *cli.Printer
	cl     *kube.Clients
	rec    cluster.Record
	pinned *manifests.Versions
	// dex is the cluster's Dex config and longhorn the Longhorn release it runs ("" for none),
	// read once (dexRead) for every render of this command.
	dex      []byte
	longhorn string
	dexRead  bool
}

func loadPlatform(ctx context.Context, o Options) (*platform, error) {
	cl, err := o.Kube()
	if err != nil {
		return nil, err
	}
	rec, err := cluster.ReadInstalled(ctx, cl.Dynamic)
	if err != nil {
		return nil, err
	}
	pinned, err := manifests.Pinned()
	if err != nil {
		return nil, err
	}
	return &platform{o: o, p: o.Printer, cl: cl, rec: rec, pinned: pinned}, nil
}

// components renders the cluster's components as its record describes them, with profile,
// monitoring mon and storage.
func (pl *platform) components(ctx context.Context, profile cluster.Profile, mon cluster.Monitoring, storage string) ([]components.Component, error) {
	if !pl.dexRead {
		dex, err := components.ReadDexConfig(ctx, pl.cl)
		if err != nil {
			return nil, err
		}
		// The Longhorn release the cluster runs stays: kip upgrade --longhorn moves it.
		release, err := components.ReadRelease(ctx, pl.cl, "longhorn")
		if err != nil {
			return nil, err
		}
		pl.dex, pl.longhorn, pl.dexRead = dex, release, true
	}
	o, err := components.Recorded(pl.rec, pl.pinned, pl.o.KipVersion)
	if err != nil {
		return nil, err
	}
	o.Sizing.Profile, o.Sizing.Storage, o.Monitoring, o.ExistingDexConfig, o.Kept = profile, storage, mon, pl.dex, map[string]string{"longhorn": pl.longhorn}
	return components.Render(o)
}

// run runs steps as one workflow under the cluster lock, then updates the record with mutate.
func (pl *platform) run(ctx context.Context, name string, steps []workflow.Step, mutate func(*cluster.Record)) error {
	steps = append(steps, workflow.Step{
		Name: "cluster-record", Title: "Record the change", Done: "Recorded the change", Already: "The record is up to date",
		Check: func(ctx context.Context) (bool, error) {
			rec, _, err := cluster.ReadRecord(ctx, pl.cl.Dynamic)
			want := rec
			mutate(&want)
			return err == nil && rec.Same(want) && rec.MaxCopies == want.MaxCopies, err
		},
		Apply: func(ctx context.Context) error {
			_, err := cluster.UpdateRecord(ctx, pl.cl.Dynamic, func(r *cluster.Record, _ bool) error { mutate(r); return nil })
			return err
		},
	})
	return workflow.OnCluster(pl.cl, pl.o.Holder, pl.o.KipVersion, pl.p).Run(ctx, &workflow.Workflow{Name: name, Steps: steps})
}

// SetMonitoring turns Prometheus (with Grafana) or Loki on or off.
func SetMonitoring(ctx context.Context, o *MonitoringOptions) error {
	component, on := o.Component, o.On
	if _, ok := monitoringNeeds[component]; !ok {
		return cli.Usagef("unknown platform component %q: choose prometheus or loki", component)
	}
	if !on {
		// Turning off asks first: refuse before connecting when nobody could answer.
		if err := o.Prompter.CanConfirm(); err != nil {
			return err
		}
	}
	pl, err := loadPlatform(ctx, o.Options)
	if err != nil {
		return err
	}
	mon := pl.rec.Monitoring
	flag := &mon.Prometheus
	if component == PlatformLoki {
		flag = &mon.Loki
	}
	if *flag == on {
		pl.p.Success(fmt.Sprintf("%s is already %s", component, onOff(on)))
		return nil
	}
	*flag = on
	mutate := func(r *cluster.Record) { r.Monitoring = mon }
	profile, err := cluster.ProfileNamed(pl.rec.Profile)
	if err != nil {
		return err
	}
	if on {
		if err := pl.checkRoom(ctx, component); err != nil {
			return err
		}
	}
	// The cluster as it will be: the component turned on, or Grafana's data sources without it.
	comps, err := pl.components(ctx, profile, mon, pl.rec.Storage)
	if err != nil {
		return err
	}
	var step workflow.Step
	if on {
		c, err := named(comps, component)
		if err != nil {
			return err
		}
		step = components.Step(pl.cl, c)
	} else {
		objs, err := pl.componentObjects(ctx, profile, component)
		if err != nil {
			return err
		}
		ok, err := o.Prompter.Confirm(fmt.Sprintf("Turn %s off? Its data (metrics or logs) is deleted with it.", component))
		if err != nil || !ok {
			return errors.Join(err, errCancelled(ok))
		}
		step = removeStep(pl.cl, component, objs)
	}
	steps := []workflow.Step{step}
	if component == PlatformLoki && mon.Prometheus {
		// Grafana, which comes with Prometheus, lists Loki as a data source only while Loki runs.
		prometheus, err := named(comps, PlatformPrometheus)
		if err != nil {
			return err
		}
		steps = append(steps, components.Step(pl.cl, prometheus))
	}
	return pl.run(ctx, "platform-"+component, steps, mutate)
}

// named is the component called name among comps.
func named(comps []components.Component, name string) (components.Component, error) {
	i := slices.IndexFunc(comps, func(c components.Component) bool { return c.Name == name })
	if i < 0 {
		return components.Component{}, fmt.Errorf("kip renders no %s component for this cluster", name)
	}
	return comps[i], nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func errCancelled(ok bool) error {
	if ok {
		return nil
	}
	return errors.New("cancelled: nothing was changed")
}

// componentObjects returns the objects component has while it is on, to delete them.
func (pl *platform) componentObjects(ctx context.Context, profile cluster.Profile, component string) ([]*unstructured.Unstructured, error) {
	all := cluster.Monitoring{Prometheus: true, Loki: true}
	comps, err := pl.components(ctx, profile, all, pl.rec.Storage)
	if err != nil {
		return nil, err
	}
	c, err := named(comps, component)
	return c.Objects, err
}

// removeStep deletes a component's objects; deleting its HelmChart has k3s's helm-controller
// uninstall the chart.
func removeStep(cl *kube.Clients, component string, objs []*unstructured.Unstructured) workflow.Step {
	return workflow.Step{
		Name: "remove-" + component, Title: "Remove " + component, Done: "Removed " + component, Already: component + " is not installed",
		Check: func(ctx context.Context) (bool, error) {
			// Deleted, or being deleted: a namespace takes a while to empty.
			for _, o := range objs {
				ri, o, err := kube.ResourceFor(ctx, cl, o)
				if err != nil {
					return false, err
				}
				live, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					continue
				}
				if err != nil || live.GetDeletionTimestamp() == nil {
					return false, err
				}
			}
			return true, nil
		},
		Apply: func(ctx context.Context) error {
			for _, o := range objs {
				ri, o, err := kube.ResourceFor(ctx, cl, o)
				if err != nil {
					return err
				}
				if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("delete %s %s: %w", o.GetKind(), o.GetName(), err)
				}
			}
			return nil
		},
	}
}

// checkRoom refuses to turn component on when the server's allocatable memory, less what its
// pods request, cannot take what the component asks.
func (pl *platform) checkRoom(ctx context.Context, component string) error {
	node, err := pl.serverNode(ctx)
	if err != nil {
		return err
	}
	pods, err := pl.cl.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return fmt.Errorf("list the server's pods: %w", err)
	}
	free := node.Status.Allocatable.Memory().DeepCopy()
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Spec.Containers {
			free.Sub(*c.Resources.Requests.Memory())
		}
	}
	need := monitoringNeeds[component]
	if free.Cmp(need) < 0 {
		return fmt.Errorf("%s needs about %s of memory and the server %s has %s left after its pods' requests: resize the server, then run this again",
			component, need.String(), node.Name, mib(free))
	}
	return nil
}

func mib(q resource.Quantity) string { return fmt.Sprintf("%dMi", q.Value()/(1<<20)) }

// serverNode is the cluster's server node.
func (pl *platform) serverNode(ctx context.Context) (*corev1.Node, error) {
	return cluster.ServerNode(ctx, pl.cl.Kube)
}

// ProfileView is the documented shape of 'kip platform profile show -o json'.
type ProfileView struct {
	Profile   cluster.Profile    `json:"profile"`
	Storage   string             `json:"storage"`
	Monitored cluster.Monitoring `json:"monitoring"`
	// ServerMemoryMiB and ServerCPUs are the server node's capacity.
	ServerMemoryMiB int64 `json:"serverMemoryMiB"`
	ServerCPUs      int64 `json:"serverCPUs"`
}

// ShowProfile prints the cluster's profile, what it sizes and the server's size.
func ShowProfile(ctx context.Context, o *Options) error {
	pl, err := loadPlatform(ctx, *o)
	if err != nil {
		return err
	}
	p, err := cluster.ProfileNamed(pl.rec.Profile)
	if err != nil {
		return err
	}
	node, err := pl.serverNode(ctx)
	if err != nil {
		return err
	}
	v := ProfileView{Profile: p, Storage: pl.rec.Storage, Monitored: pl.rec.Monitoring,
		ServerMemoryMiB: node.Status.Capacity.Memory().Value() >> 20, ServerCPUs: node.Status.Capacity.Cpu().Value()}
	w := o.Out
	if o.JSON {
		return cli.WriteJSON(w, v)
	}
	fmt.Fprintf(w, "Profile:     %s\n", p.Name)
	fmt.Fprintf(w, "Storage:     %s\n", v.Storage)
	fmt.Fprintf(w, "Server:      %d MiB, %d CPUs\n", v.ServerMemoryMiB, v.ServerCPUs)
	fmt.Fprintf(w, "Monitoring:  Prometheus %s, Loki %s\n", onOff(v.Monitored.Prometheus), onOff(v.Monitored.Loki))
	fmt.Fprintf(w, "Registry:    %s\n", p.RegistrySize)
	fmt.Fprintf(w, "console-api: %s memory\n", p.ConsoleAPIMemory)
	if p.PrometheusRetention != "" {
		fmt.Fprintf(w, "Retention:   metrics %s, logs %s\n", p.PrometheusRetention, p.LokiRetention)
	}
	return nil
}

// SetProfile changes the cluster's sizing profile, refusing one the server cannot carry, and
// re-applies the components the profile sizes. Monitoring stays as it is.
func SetProfile(ctx context.Context, o *ProfileOptions) error {
	name := o.Profile
	if _, err := cluster.ProfileNamed(name); err != nil {
		return &cli.UsageError{Err: err}
	}
	pl, err := loadPlatform(ctx, o.Options)
	if err != nil {
		return err
	}
	if pl.rec.Profile == name {
		pl.p.Success("The cluster already uses the " + name + " profile")
		return nil
	}
	node, err := pl.serverNode(ctx)
	if err != nil {
		return err
	}
	sizing, err := cluster.Choose(int(node.Status.Capacity.Memory().Value()>>20), int(node.Status.Capacity.Cpu().Value()), name, pl.rec.Storage)
	if err != nil {
		return err
	}
	if was, err := cluster.ProfileNamed(pl.rec.Profile); err == nil && pl.rec.Storage == cluster.StorageLocal && was.RegistrySize != sizing.Profile.RegistrySize {
		// A local-path volume cannot be resized: the registry keeps the volume it has.
		sizing.Profile.RegistrySize = was.RegistrySize
		pl.p.Info("The registry's volume stays at " + was.RegistrySize + ": local storage volumes cannot be resized")
	}
	comps, err := pl.components(ctx, sizing.Profile, pl.rec.Monitoring, pl.rec.Storage)
	if err != nil {
		return err
	}
	var steps []workflow.Step
	for _, c := range comps {
		switch c.Name {
		case "velero", "minio":
			// Backup storage is not sized by the profile.
			continue
		}
		steps = append(steps, components.Step(pl.cl, c))
	}
	return pl.run(ctx, "platform-profile", steps, func(r *cluster.Record) { r.Profile = name })
}
