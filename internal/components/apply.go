package components

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// componentTimeout bounds how long Apply waits for a component to roll out.
const componentTimeout = 10 * time.Minute

// Step installs one component: its objects applied, objects it only creates present,
// rolled out, and the objects that follow it applied.
func Step(cl *kube.Clients, c Component) workflow.Step {
	title := c.Name
	if c.Version != "" {
		title += " " + c.Version
	}
	drift := func(ctx context.Context) ([]string, error) {
		d, err := kube.Drift(ctx, cl, c.Objects, "")
		if err != nil {
			return nil, err
		}
		missing, err := missingObjects(ctx, cl, c.CreateOnly)
		if err != nil {
			return nil, err
		}
		deleting, err := beingDeleted(ctx, cl, append(slices.Clone(c.Objects), c.CreateOnly...))
		return append(append(d, missing...), deleting...), err
	}
	return workflow.Step{
		Name: "component-" + c.Name, Title: "Install " + title,
		Done: "Installed " + title, Already: title + " already installed",
		Check: func(ctx context.Context) (bool, error) {
			d, err := drift(ctx)
			if err != nil || len(d) > 0 {
				return false, err
			}
			ready, _, err := c.Status(ctx, cl)
			return ready, err
		},
		Plan: func(ctx context.Context) ([]string, error) {
			d, err := drift(ctx)
			if err != nil || len(d) > 0 {
				return d, err
			}
			_, pending, err := c.Status(ctx, cl)
			if pending == "" {
				return []string{"wait for it to roll out"}, err
			}
			return []string{"wait for it to roll out: " + pending}, err
		},
		Apply: func(ctx context.Context) error { return Apply(ctx, cl, c) },
	}
}

// chartJobs are the install Jobs of HelmCharts about to change, by Job, with the UID each had
// before ("" when there was none) and the generation of its HelmChart before the change.
type chartJobs map[types.NamespacedName]chartJob

type chartJob struct {
	uid types.UID
	// chart is the HelmChart, and generation its generation before the apply (0 when it did not
	// exist).
	chart      types.NamespacedName
	generation int64
}

// changedCharts finds the HelmCharts among objs that applying them would change, and notes
// their install Jobs.
func changedCharts(ctx context.Context, cl *kube.Clients, objs []*unstructured.Unstructured) (chartJobs, error) {
	jobs := chartJobs{}
	for _, o := range objs {
		if o.GetKind() != "HelmChart" {
			continue
		}
		d, err := kube.Drift(ctx, cl, []*unstructured.Unstructured{o}, "")
		if err != nil || len(d) == 0 {
			if err != nil {
				return nil, err
			}
			continue
		}
		cj := chartJob{chart: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}}
		if cj.generation, err = chartGeneration(ctx, cl, cj.chart); err != nil {
			return nil, err
		}
		name := types.NamespacedName{Namespace: o.GetNamespace(), Name: "helm-install-" + o.GetName()}
		job, err := cl.Kube.BatchV1().Jobs(name.Namespace).Get(ctx, name.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("read Job %s: %w", name, err)
		default:
			cj.uid = job.UID
		}
		jobs[name] = cj
	}
	return jobs, nil
}

// chartGeneration is the generation of the HelmChart name, 0 when there is none.
func chartGeneration(ctx context.Context, cl *kube.Clients, name types.NamespacedName) (int64, error) {
	hc, err := cl.Dynamic.Resource(HelmCharts).Namespace(name.Namespace).Get(ctx, name.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read HelmChart %s: %w", name, err)
	}
	return hc.GetGeneration(), nil
}

// unchanged drops the charts whose HelmChart the apply did not change (the same generation): a
// field another manager had set to the same value is taken over without a change, and
// helm-controller starts no Job for it.
func (jobs chartJobs) unchanged(ctx context.Context, cl *kube.Clients) error {
	for name, cj := range jobs {
		g, err := chartGeneration(ctx, cl, cj.chart)
		if err != nil {
			return err
		}
		if g == cj.generation {
			delete(jobs, name)
		}
	}
	return nil
}

// pending names a changed chart whose install Job helm-controller has not replaced yet.
func (jobs chartJobs) pending(ctx context.Context, cl *kube.Clients) (string, error) {
	for name, cj := range jobs {
		job, err := cl.Kube.BatchV1().Jobs(name.Namespace).Get(ctx, name.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && job.UID == cj.uid {
			return "k3s's helm-controller has not started Job " + name.String() + " for the new chart yet", nil
		}
		if err != nil {
			return "", fmt.Errorf("read Job %s: %w", name, err)
		}
	}
	return "", nil
}

// notYet reports whether applying failed only because what the objects need does not exist
// yet: their kind (a chart's CRD) or their namespace.
func notYet(err error) bool {
	return meta.IsNoMatchError(err) || apierrors.IsNotFound(err) || strings.Contains(err.Error(), "no matches for kind")
}

// replaceClasses deletes each StorageClass kip defines among objs that exists with other parameters,
// provisioner, reclaim policy or binding mode than objs give it: Kubernetes forbids changing
// them, so the apply that follows creates it anew. The volumes of the class keep working (a
// volume's class is only a name once it is provisioned), and a claim made while the class is
// missing waits for it.
func replaceClasses(ctx context.Context, cl *kube.Clients, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		if o.GroupVersionKind().GroupKind() != (schema.GroupKind{Group: "storage.k8s.io", Kind: "StorageClass"}) {
			continue
		}
		var want storagev1.StorageClass
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &want); err != nil {
			return fmt.Errorf("StorageClass %s: %w", o.GetName(), err)
		}
		if want.Provisioner == "" {
			continue // only metadata: another's class that kip annotates
		}
		live, err := cl.Kube.StorageV1().StorageClasses().Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read StorageClass %s: %w", want.Name, err)
		}
		same := live.Provisioner == want.Provisioner && maps.Equal(live.Parameters, want.Parameters) &&
			(want.ReclaimPolicy == nil || ptr.Equal(live.ReclaimPolicy, want.ReclaimPolicy)) &&
			(want.VolumeBindingMode == nil || ptr.Equal(live.VolumeBindingMode, want.VolumeBindingMode))
		if same {
			continue
		}
		err = cl.Kube.StorageV1().StorageClasses().Delete(ctx, want.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &live.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("replace StorageClass %s, whose parameters Kubernetes does not let kip change: %w", want.Name, err)
		}
	}
	return nil
}

// missingObjects names the objects that do not exist.
func missingObjects(ctx context.Context, cl *kube.Clients, objs []*unstructured.Unstructured) ([]string, error) {
	var out []string
	for _, o := range objs {
		ri, o, err := kube.ResourceFor(ctx, cl, o)
		if err != nil {
			return nil, err
		}
		if _, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); apierrors.IsNotFound(err) {
			out = append(out, o.GetKind()+" "+o.GetName()+": missing")
		} else if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// beingDeleted names the objects that exist with a deletion timestamp.
func beingDeleted(ctx context.Context, cl *kube.Clients, objs []*unstructured.Unstructured) ([]string, error) {
	var out []string
	for _, o := range objs {
		ri, o, err := kube.ResourceFor(ctx, cl, o)
		if err != nil {
			if notYet(err) {
				continue // its kind is not served yet: nothing of it can exist
			}
			return nil, err
		}
		live, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, err
		case live.GetDeletionTimestamp() != nil:
			out = append(out, o.GetKind()+" "+o.GetName()+": being deleted")
		}
	}
	return out, nil
}

// createMissing creates the objects that do not exist, and leaves existing ones as they are.
func createMissing(ctx context.Context, cl *kube.Clients, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		ri, o, err := kube.ResourceFor(ctx, cl, o)
		if err != nil {
			return err
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldManager: "kip"}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

// Apply installs c at the version it was rendered with: its objects server-side applied (kip
// owns their fields), the objects it only creates present, and once it has rolled out, the
// objects that follow it. It returns when c is ready, or fails after componentTimeout naming
// what is pending. install and platform apply components through it, and kip upgrade will.
func Apply(ctx context.Context, cl *kube.Clients, c Component) error {
	// An object still being deleted (a namespace emptying after kip platform disable) would take
	// what kip applies into it with it: wait until it is gone.
	all := append(slices.Clone(c.Objects), c.CreateOnly...)
	if err := kube.PollPending(ctx, componentTimeout, c.Name+"'s old objects to be deleted", func(ctx context.Context) (string, error) {
		deleting, err := beingDeleted(ctx, cl, all)
		return strings.Join(deleting, ", "), err
	}); err != nil {
		return err
	}
	// A chart whose HelmChart changes gets a new install Job from helm-controller; until
	// then its old, complete Job would count as installed.
	replaced, err := changedCharts(ctx, cl, c.Objects)
	if err != nil {
		return err
	}
	// kip owns its components' fields: a field someone else changed is taken back.
	if err := kube.Apply(ctx, cl, c.Objects, kube.ApplyOptions{Force: true}); err != nil {
		return err
	}
	if err := replaced.unchanged(ctx, cl); err != nil {
		return err
	}
	if err := createMissing(ctx, cl, c.CreateOnly); err != nil {
		return err
	}
	return kube.PollPending(ctx, componentTimeout, c.Name+" to roll out", func(ctx context.Context) (string, error) {
		if pending, err := replaced.pending(ctx, cl); pending != "" || err != nil {
			return pending, err
		}
		// The After objects are applied once the rest is ready, and only while they are not as
		// rendered: applied at every poll, their number of writes would depend on how long the
		// rollout took.
		rest := c
		rest.After = nil
		if ready, pending, err := rest.Status(ctx, cl); err != nil || !ready {
			return pending, err
		}
		if ready, pending, err := c.Status(ctx, cl); err != nil || ready {
			return pending, err
		}
		if err := replaceClasses(ctx, cl, c.After); err != nil {
			return "", err
		}
		if err := kube.Apply(ctx, cl, c.After, kube.ApplyOptions{Force: true}); err != nil {
			if !notYet(err) {
				return "", err
			}
			return "waiting for " + c.Name + "'s own objects: " + err.Error(), nil
		}
		_, pending, err := c.Status(ctx, cl)
		return pending, err
	})
}
