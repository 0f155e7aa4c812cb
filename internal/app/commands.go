package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/util/podutils"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// AppOptions names the app a command acts on; cmd/kip fills it.
type AppOptions struct {
	service.Options
	service.Ref
}

func (o *AppOptions) load(ctx context.Context) (*kube.Clients, *App, error) {
	cl, err := o.Kube()
	if err != nil {
		return nil, nil, err
	}
	a, err := Get(ctx, cl.Dynamic, o.Ref)
	return cl, a, err
}

// op is one operation of a JSON patch (RFC 6902).
type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// set is the operation that sets the value at path (adding or replacing it).
func set(path string, value any) op { return op{Op: "add", Path: path, Value: value} }

// write patches the App a was read as with ops, behind a test of the generation it was read at
// (which moves with every change of its spec): a change made meanwhile fails the write rather
// than being overwritten, and status updates (console-api's) do not. doing names the command's
// work in errors.
func write(ctx context.Context, cl *kube.Clients, a *App, doing string, ops ...op) error {
	ops = append([]op{{Op: "test", Path: "/metadata/generation", Value: a.Generation}}, ops...)
	return patch(ctx, cl, a, doing, ops, func(now *unstructured.Unstructured) string {
		if now.GetGeneration() != a.Generation {
			return fmt.Sprintf("the app changed since kip read it (generation %d, now %d)", a.Generation, now.GetGeneration())
		}
		return ""
	})
}

// patch applies the JSON patch ops to a's App. When the API server refuses it, changed reads the
// App as it is now and says what changed since a was read ("" when nothing kip tested did).
func patch(ctx context.Context, cl *kube.Clients, a *App, doing string, ops []op, changed func(now *unstructured.Unstructured) string) error {
	raw, err := json.Marshal(ops)
	if err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	apps := cl.Dynamic.Resource(AppsGVR).Namespace(a.Namespace())
	_, err = apps.Patch(ctx, a.Name, types.JSONPatchType, raw, metav1.PatchOptions{FieldManager: kube.FieldManager})
	if err == nil {
		return nil
	}
	if now, gerr := apps.Get(ctx, a.Name, metav1.GetOptions{}); gerr == nil {
		if what := changed(now); what != "" {
			return fmt.Errorf("%s: %s, so nothing was written; run the command again to act on the app as it is now", doing, what)
		}
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// pointer escapes a key for a JSON pointer (RFC 6901).
func pointer(key string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}

// autoscaleCommand names kip app autoscale with the flags that set a's bounds as its
// autoscaling stands (--off keeps it off).
func autoscaleCommand(a *App) string {
	if a.Autoscale.Enabled {
		return "'kip app autoscale " + a.Flags() + " --min N --max M'"
	}
	return "'kip app autoscale " + a.Flags() + " --off --min N --max M'"
}

// invalidAdvice says how to mend an App whose autoscaling block breaks the rules.
func invalidAdvice(a *App) string {
	return "set valid bounds and a target with 'kip app autoscale " + a.Flags() + " --min N --max M --cpu-target P', or turn autoscaling off with 'kip app autoscale " + a.Flags() + " --off'"
}

// ScaleOptions is kip app scale.
type ScaleOptions struct {
	AppOptions
	Replicas int
}

// Scale is kip app scale: it writes the app's stored count (spec.replicas), which must lie within
// its autoscaling bounds whether autoscaling is on or off. A running app without autoscaling runs
// that many pods once console-api has acted; a stopped one keeps the count for its start; with
// autoscaling on, the autoscaler moves the running count within the bounds.
func Scale(ctx context.Context, o *ScaleOptions) error {
	if o.Replicas < 0 || o.Replicas > math.MaxInt32 {
		return cli.Usagef("--replicas %d is not a count of pods", o.Replicas)
	}
	cl, a, err := o.load(ctx)
	if err != nil {
		return err
	}
	n := int32(o.Replicas)
	if why := a.Autoscale.Invalid(); why != "" {
		return fmt.Errorf("cannot scale app %s: its autoscaling settings are invalid (%s), and its stored count must lie within valid bounds; %s", a.Ref, why, invalidAdvice(a))
	}
	if b := a.Autoscale.Bounds(); !b.Holds(n) {
		msg := fmt.Sprintf("cannot scale app %s to %d: its stored count must lie within its autoscaling bounds of %s, whether autoscaling is on or off; set a count %s, or change the bounds with %s",
			a.Ref, n, b, b.Choice(), autoscaleCommand(a))
		if n == 0 {
			msg += "; to run no pod, stop the app with 'kip app stop " + a.Flags() + "'"
		}
		return errors.New(msg)
	}
	if n == a.Replicas {
		o.Printer.StepAlready(fmt.Sprintf("App %s already stores %d replicas", a.Ref, n))
		return nil
	}
	doing := fmt.Sprintf("scale app %s from %d to %d", a.Ref, a.Replicas, n)
	start := time.Now()
	if !a.Stopped() && !a.Autoscale.Enabled {
		o.Printer.StepStarted(fmt.Sprintf("Scaling app %s from %d to %d replicas", a.Ref, a.Replicas, n))
	}
	if err := write(ctx, cl, a, doing, set("/spec/replicas", n)); err != nil {
		return err
	}
	switch {
	case a.Stopped():
		o.Printer.Success(fmt.Sprintf("Stored %d replicas for app %s (was %d)", n, a.Ref, a.Replicas))
		o.Printer.Info(fmt.Sprintf("The app stays stopped until 'kip app start %s'; it starts at %s.", a.Flags(), startsAt(n, a.Autoscale)))
	case a.Autoscale.Enabled:
		o.Printer.Success(fmt.Sprintf("Stored %d replicas for app %s (was %d)", n, a.Ref, a.Replicas))
		o.Printer.Info(fmt.Sprintf("Autoscaling is on: the autoscaler moves the running count within the bounds of %s. The app runs the stored count once autoscaling is off.", a.Autoscale.Bounds()))
	default:
		if err := wait(ctx, StartTimeout, "app "+a.Ref.String()+" to run "+fmt.Sprint(n)+" replicas", func(ctx context.Context) (string, error) {
			return RunningPending(ctx, cl, a.Ref)
		}); err != nil {
			return err
		}
		o.Printer.StepDone(fmt.Sprintf("Scaled app %s to %d replicas", a.Ref, n), time.Since(start))
	}
	return nil
}

// startsAt says the count an app starts at.
func startsAt(stored int32, as Autoscale) string {
	if as.Enabled {
		return fmt.Sprintf("its minimum, %d, and the autoscaler moves it within %s", StartCount(stored, as), as.Bounds())
	}
	return fmt.Sprintf("%d replicas", stored)
}

// Stop is kip app stop: it records a stop (spec.stop) and waits until console-api has scaled the
// app's Deployment to 0 and no pod of it is left. The app stays stopped until kip app start.
func Stop(ctx context.Context, o *AppOptions) error {
	cl, a, err := o.load(ctx)
	if err != nil {
		return err
	}
	pending := func(ctx context.Context) (string, error) { return StopPending(ctx, cl, a.Ref) }
	start := time.Now()
	if a.Stopped() {
		p, err := pending(ctx)
		if err != nil {
			return err
		}
		if p == "" {
			o.Printer.StepAlready(fmt.Sprintf("App %s already stopped (%s)", a.Ref, a.Stop))
			return nil
		}
		o.Printer.StepStarted(fmt.Sprintf("App %s is already stopped (%s); waiting until its pods are gone", a.Ref, a.Stop))
	} else {
		o.Printer.StepStarted("Stopping app " + a.Ref.String())
		stop := map[string]any{"reason": StopReason, "at": time.Now().UTC().Format(time.RFC3339)}
		if err := write(ctx, cl, a, "stop app "+a.Ref.String(), set("/spec/stop", stop)); err != nil {
			return err
		}
	}
	if err := wait(ctx, StopTimeout, "app "+a.Ref.String()+" to stop", pending); err != nil {
		return err
	}
	o.Printer.StepDone("Stopped app "+a.Ref.String(), time.Since(start))
	o.Printer.Info("It stays stopped until 'kip app start " + a.Flags() + "'.")
	return nil
}

// Start is kip app start: it removes the app's stop and waits until its pods of the current
// revision are Ready. The app starts at its stored count, or at its minimum when autoscaling is
// on.
func Start(ctx context.Context, o *AppOptions) error {
	cl, a, err := o.load(ctx)
	if err != nil {
		return err
	}
	pending := func(ctx context.Context) (string, error) { return RunningPending(ctx, cl, a.Ref) }
	start := time.Now()
	if !a.Stopped() {
		p, err := pending(ctx)
		if err != nil {
			return err
		}
		if p == "" {
			d, err := GetDeployment(ctx, cl.Kube, a)
			if err != nil || d == nil {
				return err
			}
			o.Printer.StepAlready(fmt.Sprintf("App %s already running (%d of %d replicas ready)", a.Ref, d.Status.ReadyReplicas, replicas(d)))
			return nil
		}
		o.Printer.StepStarted(fmt.Sprintf("App %s is not stopped; waiting until it runs (%s)", a.Ref, p))
	} else {
		o.Printer.StepStarted(fmt.Sprintf("Starting app %s at %s", a.Ref, startsAt(a.Replicas, a.Autoscale)))
		if err := removeStop(ctx, cl, a); err != nil {
			return err
		}
	}
	if err := wait(ctx, StartTimeout, "app "+a.Ref.String()+" to run", pending); err != nil {
		return err
	}
	d, err := GetDeployment(ctx, cl.Kube, a)
	if err != nil || d == nil {
		return err
	}
	o.Printer.StepDone(fmt.Sprintf("Started app %s (%d of %d replicas ready)", a.Ref, d.Status.ReadyReplicas, replicas(d)), time.Since(start))
	return nil
}

// removeStop removes the stop a was read with, in a JSON patch whose test operation refuses the
// removal when the stop changed since.
func removeStop(ctx context.Context, cl *kube.Clients, a *App) error {
	stop, _, _ := unstructured.NestedFieldNoCopy(a.Object.Object, "spec", "stop")
	return patch(ctx, cl, a, "start app "+a.Ref.String(), []op{{Op: "test", Path: "/spec/stop", Value: stop}, {Op: "remove", Path: "/spec/stop"}},
		func(now *unstructured.Unstructured) string {
			if got, _, _ := unstructured.NestedFieldNoCopy(now.Object, "spec", "stop"); !reflect.DeepEqual(got, stop) {
				return fmt.Sprintf("its stop changed since kip read it (%s)", a.Stop)
			}
			return ""
		})
}

// Restart is kip app restart: it asks console-api to roll the app's pods (RestartAnnotation) and
// waits until the rollout has finished. A stopped app is refused: no pod of it runs.
func Restart(ctx context.Context, o *AppOptions) error {
	cl, a, err := o.load(ctx)
	if err != nil {
		return err
	}
	if a.Stopped() {
		return fmt.Errorf("cannot restart app %s: it is stopped (%s), so no pod of it runs; start it with 'kip app start %s'", a.Ref, a.Stop, a.Flags())
	}
	// Nanoseconds: a second restart within the same second still changes the pods' template.
	requested := time.Now().UTC().Format(time.RFC3339Nano)
	o.Printer.StepStarted("Restarting app " + a.Ref.String())
	start := time.Now()
	annotate := set("/metadata/annotations/"+pointer(RestartAnnotation), requested)
	if a.Object.GetAnnotations() == nil {
		annotate = set("/metadata/annotations", map[string]string{RestartAnnotation: requested})
	}
	if err := write(ctx, cl, a, "restart app "+a.Ref.String(), annotate); err != nil {
		return err
	}
	if err := wait(ctx, RestartTimeout, "app "+a.Ref.String()+" to restart", func(ctx context.Context) (string, error) {
		return RestartPending(ctx, cl, a.Ref, requested)
	}); err != nil {
		return err
	}
	o.Printer.StepDone("Restarted app "+a.Ref.String()+": its pods rolled", time.Since(start))
	return nil
}

// AutoscaleOptions is kip app autoscale. Min, Max, CPUTarget and MemoryTarget are the values
// given, nil for a flag not given (the stored value stays); a target of 0 removes it.
type AutoscaleOptions struct {
	AppOptions
	// Off turns autoscaling off, keeping the bounds, which still hold the stored count.
	Off                               bool
	Min, Max, CPUTarget, MemoryTarget *int32
}

// SetAutoscale is kip app autoscale: it writes the app's autoscaling block (spec.autoscale), on
// with the values given over the stored ones, or off. It refuses a block the rules refuse. When
// the new bounds leave the stored count outside, the count moves to the nearest bound in the same
// write, and kip says so: a running app without autoscaling scales to it.
func SetAutoscale(ctx context.Context, o *AutoscaleOptions) error {
	if !o.Off && o.Min == nil && o.Max == nil && o.CPUTarget == nil && o.MemoryTarget == nil {
		return cli.Usagef("nothing to set: give the bounds and a target (--min N --max M --cpu-target P), or --off")
	}
	if o.Off && (o.CPUTarget != nil || o.MemoryTarget != nil) {
		return cli.Usagef("--off with a target: a target applies while autoscaling is on (the stored targets stay as they are)")
	}
	cl, a, err := o.load(ctx)
	if err != nil {
		return err
	}
	old := a.Autoscale
	next := old
	next.Enabled = !o.Off
	if o.Min != nil {
		next.Min = o.Min
	}
	if o.Max != nil {
		next.Max = o.Max
	}
	target := func(given, stored *int32) *int32 {
		switch {
		case given == nil:
			return stored
		case *given == 0:
			return nil
		}
		return given
	}
	next.CPUTarget, next.MemoryTarget = target(o.CPUTarget, old.CPUTarget), target(o.MemoryTarget, old.MemoryTarget)
	if why := next.Invalid(); why != "" {
		return fmt.Errorf("cannot set the autoscaling of app %s to %s: %s (the rules: a minimum and a maximum of 1 or more, the minimum not above the maximum, a minimum above 1 only with a maximum, and while autoscaling is on a maximum and a CPU or memory target above 0)",
			a.Ref, next.Describe(), why)
	}
	changes := autoscaleChanges(old, next)
	b := next.Bounds()
	to := b.Clamp(a.Replicas)
	if to != a.Replicas {
		changes = append(changes, fmt.Sprintf("replicas: %d → %d (the stored count, into the bounds)", a.Replicas, to))
	}
	if len(changes) == 0 {
		o.Printer.StepAlready(fmt.Sprintf("App %s's autoscaling is already %s", a.Ref, next.Describe()))
		return nil
	}
	if err := write(ctx, cl, a, "set the autoscaling of app "+a.Ref.String(), set("/spec/autoscale", next.object()), set("/spec/replicas", to)); err != nil {
		return err
	}
	o.Printer.Success(fmt.Sprintf("Set the autoscaling of app %s: %s", a.Ref, next.Describe()))
	for _, c := range changes {
		o.Printer.Info("  " + c)
	}
	if to != a.Replicas {
		msg := fmt.Sprintf("The stored count moved from %d to %d, into the bounds of %s.", a.Replicas, to, b)
		if !next.Enabled && !a.Stopped() {
			msg += fmt.Sprintf(" The app scales to %d.", to)
		}
		o.Printer.Info(msg)
	}
	if a.Stopped() {
		o.Printer.Info(fmt.Sprintf("The app stays stopped until 'kip app start %s'; it starts at %s.", a.Flags(), startsAt(to, next)))
		return nil
	}
	start := time.Now()
	o.Printer.StepStarted("Waiting until app " + a.Ref.String() + " runs as set")
	if err := wait(ctx, StartTimeout, "app "+a.Ref.String()+" to run as set", func(ctx context.Context) (string, error) {
		return RunningPending(ctx, cl, a.Ref)
	}); err != nil {
		return err
	}
	o.Printer.StepDone("App "+a.Ref.String()+" runs as set", time.Since(start))
	return nil
}

// object is the block as spec.autoscale holds it, unset values left out.
func (a Autoscale) object() map[string]any {
	m := map[string]any{"enabled": a.Enabled}
	for key, v := range map[string]*int32{"minReplicas": a.Min, "maxReplicas": a.Max, "cpuTarget": a.CPUTarget, "memoryTarget": a.MemoryTarget} {
		if v != nil {
			m[key] = int64(*v)
		}
	}
	return m
}

// autoscaleChanges lists what differs between two blocks, one "field: before → after" each.
func autoscaleChanges(old, next Autoscale) []string {
	var changes []string
	if old.Enabled != next.Enabled {
		changes = append(changes, fmt.Sprintf("autoscaling: %s → %s", onOff(old.Enabled), onOff(next.Enabled)))
	}
	for _, f := range []struct {
		name      string
		old, next *int32
	}{
		{"minReplicas", old.Min, next.Min}, {"maxReplicas", old.Max, next.Max},
		{"cpuTarget", old.CPUTarget, next.CPUTarget}, {"memoryTarget", old.MemoryTarget, next.MemoryTarget},
	} {
		if orUnset(f.old) != orUnset(f.next) {
			changes = append(changes, fmt.Sprintf("%s: %s → %s", f.name, orUnset(f.old), orUnset(f.next)))
		}
	}
	return changes
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func orUnset(p *int32) string {
	if p == nil {
		return "(unset)"
	}
	return fmt.Sprint(*p)
}

// Info is what kip app info shows.
type Info struct {
	App         string `json:"app"`
	Project     string `json:"project"`
	Environment string `json:"environment"`
	Namespace   string `json:"namespace"`
	Image       string `json:"image"`
	Phase       string `json:"phase"`
	// Replicas is the stored count.
	Replicas  int32     `json:"replicas"`
	Autoscale Autoscale `json:"autoscale"`
	// Stop is the app's stop, absent while it is not stopped.
	Stop *StopRecord `json:"stop,omitempty"`
	// Deployment is the app's Deployment, absent when it does not exist.
	Deployment *DeploymentInfo   `json:"deployment,omitempty"`
	Pods       []service.PodInfo `json:"pods"`
}

// DeploymentInfo is the app's Deployment: its desired and ready replicas.
type DeploymentInfo struct {
	Name    string `json:"name"`
	Desired int32  `json:"desired"`
	Ready   int32  `json:"ready"`
}

// ShowInfo is kip app info.
func ShowInfo(ctx context.Context, o *AppOptions) error {
	cl, a, err := o.load(ctx)
	if err != nil {
		return err
	}
	info := Info{App: a.Name, Project: a.Project, Environment: a.Environment, Namespace: a.Namespace(), Image: a.Image,
		Phase: a.Phase, Replicas: a.Replicas, Autoscale: a.Autoscale, Stop: a.Stop, Pods: []service.PodInfo{}}
	d, err := GetDeployment(ctx, cl.Kube, a)
	if err != nil {
		return err
	}
	if d != nil {
		info.Deployment = &DeploymentInfo{Name: d.Name, Desired: replicas(d), Ready: d.Status.ReadyReplicas}
	}
	pods, err := Pods(ctx, cl.Kube, a, d)
	if err != nil {
		return err
	}
	slices.SortFunc(pods, func(x, y corev1.Pod) int { return strings.Compare(x.Name, y.Name) })
	for _, p := range pods {
		info.Pods = append(info.Pods, service.PodInfo{Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase), Ready: podutils.IsPodReady(&p)})
	}
	if o.JSON {
		return cli.WriteJSON(o.Out, info)
	}
	return writeInfo(o.Out, info)
}

func writeInfo(w io.Writer, i Info) error {
	var b strings.Builder
	image := i.Image
	if image == "" {
		image = "none set"
	}
	fmt.Fprintf(&b, "App:          %s (image %s)\n", i.App, image)
	fmt.Fprintf(&b, "Project:      %s, environment %s (namespace %s)\n", i.Project, i.Environment, i.Namespace)
	state := i.Phase
	if state == "" {
		state = "without a phase"
	}
	if i.Stop != nil {
		state += " (stop: " + i.Stop.String() + ")"
	}
	fmt.Fprintf(&b, "State:        %s\n", state)
	if i.Deployment != nil {
		fmt.Fprintf(&b, "Replicas:     %d stored; Deployment %s set to %d, %d ready\n", i.Replicas, i.Deployment.Name, i.Deployment.Desired, i.Deployment.Ready)
	} else {
		fmt.Fprintf(&b, "Replicas:     %d stored; no Deployment %s\n", i.Replicas, i.App)
	}
	fmt.Fprintf(&b, "Autoscaling:  %s\n", i.Autoscale.Describe())
	if len(i.Pods) == 0 {
		b.WriteString("Runs on:      no pod\n")
	}
	for _, p := range i.Pods {
		ready := "not ready"
		if p.Ready {
			ready = "ready"
		}
		node := p.Node
		if node == "" {
			node = "(none yet)"
		}
		fmt.Fprintf(&b, "Runs on:      node %s (pod %s, %s, %s)\n", node, p.Name, p.Phase, ready)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
