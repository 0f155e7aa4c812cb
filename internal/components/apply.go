package components

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
			ready, _, err := c.settled(ctx, cl)
			return ready, err
		},
		Plan: func(ctx context.Context) ([]string, error) {
			d, err := drift(ctx)
			if err != nil || len(d) > 0 {
				return d, err
			}
			_, pending, err := c.settled(ctx, cl)
			if pending == "" {
				return []string{"wait for it to roll out"}, err
			}
			return []string{"wait for it to roll out: " + pending}, err
		},
		Apply: func(ctx context.Context) error { return Apply(ctx, cl, c) },
	}
}

// replacedJobAnnotation, on a HelmChart, names the install Job k3s's helm-controller had run for
// the chart when kip last changed the chart's spec, and the chart's generation then:
// "UID/GENERATION". helm-controller replaces that Job (a new Job, a new UID) for the new spec, so
// while a chart of a later generation still has a Job of that UID, the chart is not installed
// yet, however Complete the old Job is. kip writes it with the change itself: a kip killed
// right after that write knows on its next run that the Job it finds is the old one.
const replacedJobAnnotation = "kipper.run/replaced-install-job"

// installJob is the name of the Job helm-controller runs for the HelmChart name.
func installJob(name string) string { return "helm-install-" + name }

// withReplacedJobs returns objs with each HelmChart carrying replacedJobAnnotation: a new one when
// applying the chart changes its spec (the server's dry run gives it a new generation) and it has
// an install Job, else the one the chart already carries (the apply owns the annotation, and
// would drop it otherwise).
func withReplacedJobs(ctx context.Context, cl *kube.Clients, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	out := slices.Clone(objs)
	for i, o := range objs {
		if o.GroupVersionKind().GroupKind() != helmChartGK {
			continue
		}
		live, planned, err := kube.Preview(ctx, cl, o, kube.ApplyOptions{Force: true})
		if err != nil && notYet(err) || err == nil && live == nil {
			continue // a new chart: it has no Job of its own yet
		}
		if err != nil {
			return nil, err
		}
		mark := live.GetAnnotations()[replacedJobAnnotation]
		if planned.GetGeneration() != live.GetGeneration() {
			job, err := cl.Kube.BatchV1().Jobs(o.GetNamespace()).Get(ctx, installJob(o.GetName()), metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				mark = ""
			case err != nil:
				return nil, fmt.Errorf("read Job %s/%s: %w", o.GetNamespace(), installJob(o.GetName()), err)
			default:
				mark = fmt.Sprintf("%s/%d", job.UID, live.GetGeneration())
			}
		}
		if mark == "" {
			continue
		}
		o = o.DeepCopy()
		annotations := o.GetAnnotations()
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[replacedJobAnnotation] = mark
		o.SetAnnotations(annotations)
		out[i] = o
	}
	return out, nil
}

// notReplaced names a HelmChart of objs whose install Job is still the one its
// replacedJobAnnotation says kip's last change replaces, "" when there is none.
func notReplaced(ctx context.Context, cl *kube.Clients, objs []*unstructured.Unstructured) (string, error) {
	for _, o := range objs {
		if o.GroupVersionKind().GroupKind() != helmChartGK {
			continue
		}
		ns, name := o.GetNamespace(), o.GetName()
		chart, err := cl.Dynamic.Resource(HelmCharts).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err != nil && notYet(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("read HelmChart %s/%s: %w", ns, name, err)
		}
		uid, generation, ok := strings.Cut(chart.GetAnnotations()[replacedJobAnnotation], "/")
		if g, err := strconv.ParseInt(generation, 10, 64); !ok || err != nil || chart.GetGeneration() <= g {
			continue
		}
		job, err := cl.Kube.BatchV1().Jobs(ns).Get(ctx, installJob(name), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return "", fmt.Errorf("read Job %s/%s: %w", ns, installJob(name), err)
		case string(job.UID) == uid:
			return fmt.Sprintf("HelmChart %s/%s: Job %s is the one from before kip changed the chart; k3s's helm-controller has not replaced it yet", ns, name, installJob(name)), nil
		}
	}
	return "", nil
}

// settled is c.Status, with a changed chart whose install Job helm-controller has not replaced
// yet (notReplaced) pending.
func (c Component) settled(ctx context.Context, cl *kube.Clients) (ready bool, pending string, err error) {
	if pending, err := notReplaced(ctx, cl, c.Objects); pending != "" || err != nil {
		return false, pending, err
	}
	return c.Status(ctx, cl)
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
	// A chart whose spec changes gets a new install Job from helm-controller; until then its
	// old, Complete Job would count as installed. The chart says which Job it replaces.
	objs, err := withReplacedJobs(ctx, cl, c.Objects)
	if err != nil {
		return err
	}
	// kip owns its components' fields: a field someone else changed is taken back.
	if err := kube.Apply(ctx, cl, objs, kube.ApplyOptions{Force: true}); err != nil {
		return err
	}
	if err := createMissing(ctx, cl, c.CreateOnly); err != nil {
		return err
	}
	return kube.PollPending(ctx, componentTimeout, c.Name+" to roll out", func(ctx context.Context) (string, error) {
		if pending, err := notReplaced(ctx, cl, c.Objects); pending != "" || err != nil {
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
