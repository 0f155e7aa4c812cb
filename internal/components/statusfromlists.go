package components

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kipper.run/kip/internal/kube"
)

// Listed holds what decides whether components are ready, read for many components at once by
// ReadListed with one list request per kind, so that a reader of every component (kip status)
// makes the same few requests whatever the number of components and of namespaces. StatusFrom
// judges one component from it by the rules of Status, which reads each object on its own.
//
// Each kind keeps its own error: a list that failed makes the components that need it fail,
// not the others.
type Listed struct {
	// jobs are the Jobs in the namespaces of the components' HelmCharts, by namespace.
	jobs    map[string]map[string]*batchv1.Job
	jobsErr map[string]error
	// crds are the components' CRDs by name, nil for one that does not exist.
	crds    map[string]*apiextensionsv1.CustomResourceDefinition
	crdsErr error
	// workloads are every Deployment, DaemonSet and StatefulSet of the cluster, by namespace.
	workloads    map[string][]runtime.Object
	workloadsErr error
	// after are the live objects of the components' After objects, by group of one list each.
	after map[afterGroup]*afterList
}

// afterGroup is one list request: a kind in a namespace ("" for cluster-scoped kinds).
type afterGroup struct {
	gvk       schema.GroupVersionKind
	namespace string
}

type afterList struct {
	unserved bool // the API serves no such kind (its CRD is not installed yet)
	err      error
	live     map[string]*unstructured.Unstructured
}

// ReadListed reads what StatusFrom needs to judge comps:
//   - the Jobs of each namespace holding a HelmChart of comps (k3s's helm-controller's
//     helm-install Jobs run there): one list per namespace, kube-system for all of kip's charts;
//   - the CustomResourceDefinitions among their objects: one list of those kip labels as its own
//     (app.kubernetes.io/managed-by=kip), and a read of any it lacks, normally none;
//   - every Deployment, DaemonSet and StatefulSet of the cluster: one list per kind, across
//     namespaces (a chart's namespace is judged by all its workloads);
//   - the live copies of their After objects: one list per kind and namespace.
func ReadListed(ctx context.Context, cl *kube.Clients, comps []Component) *Listed {
	l := &Listed{
		jobs: map[string]map[string]*batchv1.Job{}, jobsErr: map[string]error{},
		crds: map[string]*apiextensionsv1.CustomResourceDefinition{}, workloads: map[string][]runtime.Object{},
		after: map[afterGroup]*afterList{},
	}
	var chartNamespaces, crdNames []string
	workloads := false
	for _, c := range comps {
		for _, o := range c.Objects {
			gvk := o.GroupVersionKind()
			switch {
			case gvk.GroupKind() == helmChartGK:
				if !slices.Contains(chartNamespaces, o.GetNamespace()) {
					chartNamespaces = append(chartNamespaces, o.GetNamespace())
				}
				workloads = workloads || len(c.Namespaces) > 0
			case gvk.GroupKind() == crdGK:
				crdNames = append(crdNames, o.GetName())
			case gvk.Group == "apps" && isWorkloadKind(gvk.Kind):
				workloads = true
			}
		}
	}
	for _, ns := range chartNamespaces {
		l.readJobs(ctx, cl, ns)
	}
	if len(crdNames) > 0 {
		l.readCRDs(ctx, cl, crdNames)
	}
	if workloads {
		l.workloadsErr = l.readWorkloads(ctx, cl)
	}
	reset := false
	for _, c := range comps {
		for _, o := range c.After {
			g := afterGroup{gvk: o.GroupVersionKind(), namespace: o.GetNamespace()}
			if l.after[g] == nil {
				l.after[g] = readAfter(ctx, cl, g, &reset)
			}
		}
	}
	return l
}

func (l *Listed) readJobs(ctx context.Context, cl *kube.Clients, ns string) {
	list, err := cl.Kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		l.jobsErr[ns] = fmt.Errorf("list Jobs in %s: %w", ns, err)
		return
	}
	byName := make(map[string]*batchv1.Job, len(list.Items))
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	l.jobs[ns] = byName
}

func (l *Listed) readCRDs(ctx context.Context, cl *kube.Clients, names []string) {
	crds := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions()
	list, err := crds.List(ctx, metav1.ListOptions{LabelSelector: managedByLabel + "=kip"})
	if err != nil {
		l.crdsErr = fmt.Errorf("list kip's CRDs: %w", err)
		return
	}
	for i := range list.Items {
		l.crds[list.Items[i].Name] = &list.Items[i]
	}
	// One kip applied without its labels, or another's of the same name.
	for _, name := range names {
		if _, ok := l.crds[name]; ok {
			continue
		}
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			l.crds[name] = nil
		case err != nil:
			l.crdsErr = fmt.Errorf("get CRD %s: %w", name, err)
			return
		default:
			l.crds[name] = crd
		}
	}
}

func (l *Listed) readWorkloads(ctx context.Context, cl *kube.Clients) error {
	apps := cl.Kube.AppsV1()
	deps, err := apps.Deployments(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Deployments: %w", err)
	}
	dss, err := apps.DaemonSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list DaemonSets: %w", err)
	}
	stss, err := apps.StatefulSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list StatefulSets: %w", err)
	}
	for i := range deps.Items {
		l.workloads[deps.Items[i].Namespace] = append(l.workloads[deps.Items[i].Namespace], &deps.Items[i])
	}
	for i := range dss.Items {
		l.workloads[dss.Items[i].Namespace] = append(l.workloads[dss.Items[i].Namespace], &dss.Items[i])
	}
	for i := range stss.Items {
		l.workloads[stss.Items[i].Namespace] = append(l.workloads[stss.Items[i].Namespace], &stss.Items[i])
	}
	return nil
}

// readAfter lists one kind in one namespace. A kind the mapper does not know makes it forget
// what it discovered and ask again, once for all groups (*reset): a CRD installed since.
func readAfter(ctx context.Context, cl *kube.Clients, g afterGroup, reset *bool) *afterList {
	a := &afterList{}
	mapping, err := cl.Mapper.RESTMapping(g.gvk.GroupKind(), g.gvk.Version)
	if meta.IsNoMatchError(err) && !*reset {
		*reset = true
		if r, ok := cl.Mapper.(meta.ResettableRESTMapper); ok {
			r.Reset()
		}
		mapping, err = cl.Mapper.RESTMapping(g.gvk.GroupKind(), g.gvk.Version)
	}
	switch {
	case meta.IsNoMatchError(err):
		a.unserved = true
		return a
	case err != nil:
		a.err = fmt.Errorf("find the resource of %s: %w", g.gvk.Kind, err)
		return a
	}
	ri := cl.Dynamic.Resource(mapping.Resource)
	var list *unstructured.UnstructuredList
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		list, err = ri.Namespace(g.namespace).List(ctx, metav1.ListOptions{})
	} else {
		list, err = ri.List(ctx, metav1.ListOptions{})
	}
	if err != nil {
		what := mapping.Resource.Resource
		if g.namespace != "" {
			what += " in " + g.namespace
		}
		a.err = fmt.Errorf("list %s: %w", what, err)
		return a
	}
	a.live = make(map[string]*unstructured.Unstructured, len(list.Items))
	for i := range list.Items {
		a.live[list.Items[i].GetName()] = &list.Items[i]
	}
	return a
}

// StatusFrom is Status judged from l, which ReadListed read for a set of components including c:
// the same rules, and the same pending texts.
func (c Component) StatusFrom(l *Listed) (ready bool, pending string, err error) {
	var p []string
	add := func(s string) {
		if s != "" {
			p = append(p, s)
		}
	}
	fail := func(err error) (bool, string, error) {
		return false, "", fmt.Errorf("status of %s: %w", c.Name, err)
	}
	var charts []string
	for _, o := range c.Objects {
		gvk := o.GroupVersionKind()
		switch {
		case gvk.GroupKind() == helmChartGK:
			charts = append(charts, o.GetName())
			jobs, ok := l.jobs[o.GetNamespace()]
			if !ok {
				return fail(cmpErr(l.jobsErr[o.GetNamespace()], "Jobs in "+o.GetNamespace()))
			}
			add(helmJobPending(o, jobs[installJob(o.GetName())]))
		case gvk.GroupKind() == crdGK:
			if l.crdsErr != nil {
				return fail(l.crdsErr)
			}
			crd, ok := l.crds[o.GetName()]
			if !ok {
				return fail(cmpErr(nil, "CRD "+o.GetName()))
			}
			add(crdPendingFrom(o.GetName(), crd))
		case gvk.Group == "apps" && isWorkloadKind(gvk.Kind):
			if l.workloadsErr != nil {
				return fail(l.workloadsErr)
			}
			s, err := workloadPendingFrom(l.workloads[o.GetNamespace()], gvk.Kind, o.GetNamespace(), o.GetName())
			if err != nil {
				return fail(err)
			}
			add(s)
		}
	}
	if len(charts) > 0 && len(c.Namespaces) > 0 {
		if l.workloadsErr != nil {
			return fail(l.workloadsErr)
		}
		for _, ns := range c.Namespaces {
			s, err := workloadsPending(l.workloads[ns], charts)
			if err != nil {
				return fail(err)
			}
			add(s)
		}
	}
	for _, o := range c.After {
		a := l.after[afterGroup{gvk: o.GroupVersionKind(), namespace: o.GetNamespace()}]
		switch {
		case a == nil:
			return fail(cmpErr(nil, o.GetKind()+" "+o.GetName()))
		case a.err != nil:
			return fail(a.err)
		}
		add(afterPendingFrom(o, a))
	}
	return len(p) == 0, strings.Join(p, "; "), nil
}

// cmpErr is the error of a list that failed, or says that ReadListed did not read what was
// asked: it was given other components.
func cmpErr(err error, what string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("%s not read: the listed objects were read for other components", what)
}

// helmJobPending judges the helm-install Job of chart (nil when it does not exist), as
// helmChartPending does.
func helmJobPending(chart *unstructured.Unstructured, job *batchv1.Job) string {
	ns, name := chart.GetNamespace(), chart.GetName()
	want, _, _ := unstructured.NestedString(chart.Object, "spec", "version")
	jobName := installJob(name)
	id := fmt.Sprintf("HelmChart %s/%s", ns, name)
	if job == nil {
		return fmt.Sprintf("%s: Job %s not created yet (k3s's helm-controller creates it)", id, jobName)
	}
	if got := jobEnv(job, "VERSION"); got != want {
		return fmt.Sprintf("%s: Job %s installs version %q, not %s yet", id, jobName, got, want)
	}
	for _, cond := range job.Status.Conditions {
		if cond.Status != corev1.ConditionTrue {
			continue
		}
		switch cond.Type {
		case batchv1.JobComplete:
			return ""
		case batchv1.JobFailed:
			why := kube.ConditionText(cond.Reason, cond.Message)
			return fmt.Sprintf("%s: Job %s failed installing %s (%s); see kubectl -n %s logs job/%s", id, jobName, want, why, ns, jobName)
		}
	}
	if job.Spec.Suspend != nil && *job.Spec.Suspend {
		return fmt.Sprintf("%s: Job %s waiting to start", id, jobName)
	}
	s := fmt.Sprintf("%s: Job %s installing %s", id, jobName, want)
	switch f := job.Status.Failed; {
	case f == 1:
		s += " (1 failed attempt)"
	case f > 1:
		s += fmt.Sprintf(" (%d failed attempts)", f)
	}
	return s
}

// crdPendingFrom judges a CRD (nil when it does not exist), as crdPending does.
func crdPendingFrom(name string, crd *apiextensionsv1.CustomResourceDefinition) string {
	if crd == nil {
		return "CRD " + name + " not found"
	}
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return ""
		}
	}
	return "CRD " + name + " not established"
}

// workloadPendingFrom judges the workload kind ns/name among the workloads of ns, as
// workloadPending does.
func workloadPendingFrom(objs []runtime.Object, kind, ns, name string) (string, error) {
	for _, o := range objs {
		if workloadKind(o) == kind && o.(metav1.Object).GetName() == name {
			done, pending, err := kube.RolloutStatus(o)
			if err != nil || done {
				return "", err
			}
			return pending, nil
		}
	}
	return fmt.Sprintf("%s %s/%s not found", kind, ns, name), nil
}

func workloadKind(o runtime.Object) string {
	switch o.(type) {
	case *appsv1.Deployment:
		return "Deployment"
	case *appsv1.DaemonSet:
		return "DaemonSet"
	case *appsv1.StatefulSet:
		return "StatefulSet"
	}
	return ""
}

// workloadsPending judges a namespace's workloads that no other Helm release than charts owns,
// as namespacePending does.
func workloadsPending(objs []runtime.Object, charts []string) (string, error) {
	var pending []string
	for _, o := range objs {
		if rel, ok := o.(metav1.Object).GetAnnotations()[helmReleaseAnnotation]; ok && !slices.Contains(charts, rel) {
			continue
		}
		done, p, err := kube.RolloutStatus(o)
		if err != nil {
			return "", err
		}
		if !done {
			pending = append(pending, p)
		}
	}
	sort.Strings(pending)
	return strings.Join(pending, "; "), nil
}

// afterPendingFrom judges an After object against its kind's list, as afterPending does.
func afterPendingFrom(want *unstructured.Unstructured, a *afterList) string {
	gvk := want.GroupVersionKind()
	id := gvk.Kind + " " + want.GetName()
	if want.GetNamespace() != "" {
		id = gvk.Kind + " " + want.GetNamespace() + "/" + want.GetName()
	}
	if a.unserved {
		return fmt.Sprintf("%s: %s is not served yet", id, gvk.GroupVersion().WithKind(gvk.Kind))
	}
	live := a.live[want.GetName()]
	if live == nil {
		return id + " not applied yet"
	}
	if normalize := storedAs[gvk.GroupKind()]; normalize != nil {
		live = normalize(want, live)
	}
	if path := firstDifference(want.Object, live.Object, ""); path != "" {
		return fmt.Sprintf("%s differs from what kip applies at %s", id, path)
	}
	return ""
}
