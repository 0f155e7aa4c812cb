// Package consolestandin is the test lab's stand-in for the part of console-api kip relies on:
// the contract internal/service documents (docs/console.md). It is a test tool, never shipped.
//
// It keeps, for every Project, a namespace per environment (<project>-<environment>, listed in
// status.namespaces) and deletes the namespaces of a deleted project or a removed environment,
// reporting the condition WaitingForStorageMove while the API server refuses a deletion because a
// move runs there; and for every Service, a StatefulSet named as the service with one replica (none
// when spec.stopped, or while a move is unfinished), claims data and (postgres, mysql) dump,
// spec.resources on its container, status.phase and status.observedGeneration. The data claim of
// a service with spec.copies 2 is in the two-copy class, and its StatefulSet is created only once
// two Ready nodes can hold copies (CopyHolders). For every App it keeps a Deployment named as the
// app (apps.go): none running while spec.stop is present; with autoscaling on, its count as it is
// when within the bounds, else the nearest bound, the minimum from 0 (it has no autoscaler: the
// count moves only when the bounds leave it outside); else spec.replicas. The app's restart request
// goes onto the pod template; the App's status has its phase, replicas, ready replicas and
// observedGeneration.
//
// A test can make it play a console-api that is slow (Delay: it acts on a Service or an App only
// that long after it last changed) or down (Down, until Up: it changes nothing).
package consolestandin

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/test/wake"
)

// Finalizer holds a deleted Project until its namespaces are gone.
const Finalizer = "kipper.run/namespaces"

// WaitingForStorageMove is the Project condition while a namespace deletion is refused by kip's
// move policy.
const WaitingForStorageMove = "WaitingForStorageMove"

// dumpSize is the dump volume's size.
const dumpSize = "1Gi"

// Standin reconciles Kipper's objects as console-api does.
type Standin struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Image and Command run each service's container, and each app's (an App's spec.image, when
	// set, instead of Image).
	Image   string
	Command []string
	// Workloads run the services of the types they name otherwise: their own image, command,
	// environment and pod annotations (such as Velero's backup hooks, which console-api puts on
	// a database's pod for its consistent dumps).
	Workloads map[string]Workload
	// CopyHolders are the nodes that can hold a copy of a service's data now: kip's
	// cluster.CopyHolders, given by the test. Only services with two copies need it.
	CopyHolders func(context.Context, *kube.Clients) ([]string, error)
	// Interval is how often it reconciles everything when nothing it watches changed (a second
	// when zero): it reconciles on every change to Projects, Services, Apps, namespaces,
	// StatefulSets, Deployments and Nodes, as console-api's controllers react to their watches.
	Interval time.Duration
	// Delay is how long after a Service or an App changed (created, its spec, a Service's move
	// annotation or an App's restart request) the stand-in acts on it, playing a console-api
	// slow to react: until then it leaves its StatefulSet or Deployment and its status as they
	// are. A change within the delay starts it again. Zero acts at once.
	Delay time.Duration
	// Logf receives what it does and what fails.
	Logf func(format string, args ...any)

	// mu is held for each pass, so that Down returns only once no pass runs.
	mu   sync.Mutex
	down bool
	// changed is when each Service and App (by UID) was first seen as it is now.
	changed map[types.UID]change
	loop    *wake.Loop
	due     *time.Timer // pokes loop when the next delayed Service or App is due
}

// change is a Service or an App as the stand-in acts on it, and when it first saw it so.
type change struct {
	version string
	at      time.Time
}

// Down stops the stand-in, as console-api stopped or crashed: once Down returns, no pass runs
// and nothing is changed until Up. Run keeps waiting meanwhile.
func (s *Standin) Down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = true
}

// Up starts the stand-in again after Down: a pass follows at once, as console-api started again
// lists what its watches missed.
func (s *Standin) Up() {
	s.mu.Lock()
	s.down = false
	loop := s.loop
	s.mu.Unlock()
	if loop != nil {
		loop.Poke()
	}
}

// Workload is how the services of one type run.
type Workload struct {
	Image       string
	Command     []string
	Env         []corev1.EnvVar
	Annotations map[string]string
}

// Run reconciles until ctx ends.
func (s *Standin) Run(ctx context.Context) {
	l := wake.New()
	s.mu.Lock()
	s.loop = l
	s.mu.Unlock()
	interval := s.Interval
	if interval == 0 {
		interval = time.Second
	}
	l.WatchResource(ctx, s.Dynamic, service.ProjectsGVR, "")
	l.WatchResource(ctx, s.Dynamic, service.ServicesGVR, "")
	l.WatchResource(ctx, s.Dynamic, app.AppsGVR, "")
	core := s.Kube.CoreV1().RESTClient()
	l.Watch(ctx, cache.NewListWatchFromClient(core, "namespaces", "", fields.Everything()), &corev1.Namespace{})
	l.Watch(ctx, cache.NewListWatchFromClient(core, "nodes", "", fields.Everything()), &corev1.Node{})
	l.Watch(ctx, cache.NewListWatchFromClient(s.Kube.AppsV1().RESTClient(), "statefulsets", "", fields.Everything()), &appsv1.StatefulSet{})
	l.Watch(ctx, cache.NewListWatchFromClient(s.Kube.AppsV1().RESTClient(), "deployments", "", fields.Everything()), &appsv1.Deployment{})
	l.Run(ctx, interval, func() {
		if err := s.Reconcile(ctx); err != nil && ctx.Err() == nil {
			s.Logf("console stand-in: %v", err)
		}
	})
}

// Reconcile makes one pass over every Project, Service and App; it changes nothing while the
// stand-in is down.
func (s *Standin) Reconcile(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil
	}
	projects, err := s.Dynamic.Resource(service.ProjectsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list projects: %w", err)
	}
	var errs []error
	for i := range projects.Items {
		errs = append(errs, s.project(ctx, &projects.Items[i]))
	}
	services, err := s.Dynamic.Resource(service.ServicesGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list services: %w", err))...)
	}
	now := time.Now()
	seen := map[types.UID]change{}
	var next time.Duration // until the first delayed Service or App is due
	due := func(u *unstructured.Unstructured, annotation string) bool {
		wait := s.delayed(u, annotation, now, seen)
		if wait > 0 && (next == 0 || wait < next) {
			next = wait
		}
		return wait <= 0
	}
	for i := range services.Items {
		u := &services.Items[i]
		if due(u, u.GetAnnotations()[service.MoveAnnotation]) {
			errs = append(errs, s.service(ctx, u))
		}
	}
	apps, err := s.Dynamic.Resource(app.AppsGVR).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// A cluster without Kipper's App CRD has no apps.
	case err != nil:
		errs = append(errs, fmt.Errorf("list apps: %w", err))
	default:
		for i := range apps.Items {
			u := &apps.Items[i]
			if due(u, u.GetAnnotations()[app.RestartAnnotation]) {
				errs = append(errs, s.app(ctx, u))
			}
		}
	}
	s.changed = seen
	s.wakeIn(next)
	return errors.Join(errs...)
}

// delayed records in seen when u was first seen as it is (its generation and annotation, the one
// annotation of its own the stand-in acts on), and returns how long the stand-in still waits
// before it acts on it (Delay after that), 0 once it acts.
func (s *Standin) delayed(u *unstructured.Unstructured, annotation string, now time.Time, seen map[types.UID]change) time.Duration {
	if s.Delay <= 0 {
		return 0
	}
	version := fmt.Sprintf("%d/%s", u.GetGeneration(), annotation)
	c, ok := s.changed[u.GetUID()]
	if !ok || c.version != version {
		c = change{version: version, at: now}
	}
	seen[u.GetUID()] = c
	return c.at.Add(s.Delay).Sub(now)
}

// wakeIn asks Run for a pass after d, when the first delayed Service or App is due (none when d
// is 0). Reconcile called on its own leaves the next pass to its caller.
func (s *Standin) wakeIn(d time.Duration) {
	switch {
	case d <= 0 || s.loop == nil:
	case s.due == nil:
		s.due = time.AfterFunc(d, s.loop.Poke)
	default:
		s.due.Reset(d)
	}
}

func (s *Standin) project(ctx context.Context, p *unstructured.Unstructured) error {
	want := map[string]bool{}
	if p.GetDeletionTimestamp() == nil {
		if !slices.Contains(p.GetFinalizers(), Finalizer) {
			p.SetFinalizers(append(p.GetFinalizers(), Finalizer))
			updated, err := s.Dynamic.Resource(service.ProjectsGVR).Update(ctx, p, metav1.UpdateOptions{})
			if err != nil {
				return fmt.Errorf("add the finalizer of project %s: %w", p.GetName(), err)
			}
			p = updated
		}
		for _, env := range service.Environments(p) {
			ns := p.GetName() + "-" + env
			want[ns] = true
			_, err := s.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
				Labels: map[string]string{service.ProjectLabel: p.GetName()}}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create namespace %s: %w", ns, err)
			}
		}
	}
	list, err := s.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: service.ProjectLabel + "=" + p.GetName()})
	if err != nil {
		return fmt.Errorf("list the namespaces of project %s: %w", p.GetName(), err)
	}
	var kept, refused []string
	for _, ns := range list.Items {
		if want[ns.Name] {
			kept = append(kept, ns.Name)
			continue
		}
		if ns.DeletionTimestamp != nil {
			continue
		}
		err := s.Kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
		switch {
		case apierrors.IsForbidden(err):
			refused = append(refused, ns.Name+": "+apiMessage(err))
		case err != nil && !apierrors.IsNotFound(err):
			return fmt.Errorf("delete namespace %s: %w", ns.Name, err)
		}
	}
	slices.Sort(kept)
	status := map[string]any{"namespaces": toAny(kept), "phase": "Ready"}
	cond := map[string]any{"type": WaitingForStorageMove, "status": "False", "reason": "NoMove", "message": ""}
	if len(refused) > 0 {
		cond = map[string]any{"type": WaitingForStorageMove, "status": "True", "reason": "NamespaceDeletionRefused",
			"message": strings.Join(refused, "; ")}
	}
	if p.GetDeletionTimestamp() != nil {
		status["phase"] = "Deleting"
	}
	status["conditions"] = []any{cond}
	if old, _, _ := unstructured.NestedMap(p.Object, "status"); !reflect.DeepEqual(old, status) {
		p.Object["status"] = status
		if _, err := s.Dynamic.Resource(service.ProjectsGVR).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("update the status of project %s: %w", p.GetName(), err)
		}
	}
	if p.GetDeletionTimestamp() != nil && len(list.Items) == 0 {
		latest, err := s.Dynamic.Resource(service.ProjectsGVR).Get(ctx, p.GetName(), metav1.GetOptions{})
		if err != nil {
			return ignoreNotFound(err)
		}
		latest.SetFinalizers(slices.DeleteFunc(latest.GetFinalizers(), func(f string) bool { return f == Finalizer }))
		if _, err := s.Dynamic.Resource(service.ProjectsGVR).Update(ctx, latest, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("release project %s: %w", p.GetName(), ignoreNotFound(err))
		}
	}
	return nil
}

func (s *Standin) service(ctx context.Context, u *unstructured.Unstructured) error {
	if u.GetDeletionTimestamp() != nil {
		return nil // the garbage collector removes the StatefulSet it owns
	}
	ns := u.GetNamespace()
	nsObj, err := s.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read namespace %s: %w", ns, err)
	}
	if nsObj.DeletionTimestamp != nil {
		return nil // its namespace goes, and the Service with it
	}
	project := nsObj.Labels[service.ProjectLabel]
	if project == "" {
		return fmt.Errorf("service %s/%s: namespace %s belongs to no project", ns, u.GetName(), ns)
	}
	ref := service.RefIn(project, ns, u.GetName())
	svc, err := service.FromObject(ref, u)
	if err != nil {
		return err
	}
	want, err := s.statefulSet(u, svc)
	if err != nil {
		return err
	}
	sets := s.Kube.AppsV1().StatefulSets(ns)
	live, err := sets.Get(ctx, svc.StatefulSet(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && svc.Copies == 2:
		// The data volume of a service with two copies is created once two Ready nodes can hold
		// copies.
		if s.CopyHolders == nil {
			return fmt.Errorf("service %s has two copies, and the stand-in was given no CopyHolders to tell which nodes can hold them", svc.Ref)
		}
		holders, err := s.CopyHolders(ctx, &kube.Clients{Kube: s.Kube, Dynamic: s.Dynamic})
		if err != nil {
			return err
		}
		if len(holders) < 2 {
			return nil
		}
		if _, err := sets.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create StatefulSet %s/%s: %w", ns, want.Name, err)
		}
		return nil // its status on the next pass
	case apierrors.IsNotFound(err):
		live, err = sets.Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create StatefulSet %s/%s: %w", ns, want.Name, err)
		}
	case err != nil:
		return fmt.Errorf("read StatefulSet %s/%s: %w", ns, want.Name, err)
	case claimClass(live) != claimClass(want):
		// A claim template cannot change: recreate the StatefulSet and keep its pods' claims.
		err := sets.Delete(ctx, live.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("replace StatefulSet %s/%s: %w", ns, live.Name, err)
		}
		return nil // created on the next pass, once it is gone
	default:
		live.Spec.Replicas, live.Spec.Template = want.Spec.Replicas, want.Spec.Template
		switch live, err = sets.Update(ctx, live, metav1.UpdateOptions{}); {
		case apierrors.IsConflict(err):
			return nil // the StatefulSet controller wrote its status meanwhile: the next pass updates it
		case err != nil:
			return fmt.Errorf("update StatefulSet %s/%s: %w", ns, want.Name, err)
		}
	}
	pods, err := service.Pods(ctx, s.Kube, svc)
	if err != nil {
		return err
	}
	phase := phaseOf(*want.Spec.Replicas, live, pods)
	status := map[string]any{"phase": phase, "observedGeneration": u.GetGeneration()}
	if old, _, _ := unstructured.NestedMap(u.Object, "status"); reflect.DeepEqual(old, status) {
		return nil
	}
	u.Object["status"] = status
	if _, err := s.Dynamic.Resource(service.ServicesGVR).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update the status of service %s/%s: %w", ns, u.GetName(), err)
	}
	return nil
}

// phaseOf is Running (a Ready pod of the current revision), Stopped (no pod left), or on the way.
func phaseOf(replicas int32, sts *appsv1.StatefulSet, pods []corev1.Pod) string {
	if replicas == 0 {
		if len(pods) == 0 {
			return service.PhaseStopped
		}
		return service.PhaseStopping
	}
	for _, p := range pods {
		if p.DeletionTimestamp == nil && ready(&p) && sts.Status.UpdateRevision != "" && p.Labels[appsv1.ControllerRevisionHashLabelKey] == sts.Status.UpdateRevision {
			return service.PhaseRunning
		}
	}
	return service.PhaseStarting
}

func (s *Standin) statefulSet(owner *unstructured.Unstructured, svc *service.Service) (*appsv1.StatefulSet, error) {
	replicas := int32(1)
	if svc.Stopped || svc.Move != "" {
		replicas = 0
	}
	labels := map[string]string{service.Label: svc.Name}
	res, err := resources(svc.Resources)
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", svc.Ref, err)
	}
	mounts := []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	storage := svc.Storage
	if storage == "" {
		storage = "1Gi"
	}
	size, err := resource.ParseQuantity(storage)
	if err != nil {
		return nil, fmt.Errorf("service %s: spec.storage %q: %w", svc.Ref, storage, err)
	}
	claim := func(name string, size resource.Quantity, class string) corev1.PersistentVolumeClaim {
		c := corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		}}
		if class != "" {
			c.Spec.StorageClassName = ptr.To(class)
		}
		return c
	}
	dataClass := svc.StorageClass
	if svc.Copies == 2 {
		dataClass = cluster.LonghornTwoCopiesClass
	}
	run := Workload{Image: s.Image, Command: s.Command}
	if w, ok := s.Workloads[svc.Type]; ok {
		run = w
	}
	claims := []corev1.PersistentVolumeClaim{claim("data", size, dataClass)}
	if svc.DumpClaim() != "" {
		claims = append(claims, claim("dump", resource.MustParse(dumpSize), svc.StorageClass))
		mounts = append(mounts, corev1.VolumeMount{Name: "dump", MountPath: "/dump"})
	}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: svc.StatefulSet(), Namespace: svc.Namespace(), Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: owner.GetAPIVersion(), Kind: owner.GetKind(), Name: owner.GetName(), UID: owner.GetUID()}}},
		Spec: appsv1.StatefulSetSpec{
			Replicas:             ptr.To(replicas),
			ServiceName:          svc.Name,
			Selector:             &metav1.LabelSelector{MatchLabels: labels},
			VolumeClaimTemplates: claims,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: run.Annotations},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{Name: svc.Type, Image: run.Image, Command: run.Command, Env: run.Env,
						Resources: res, VolumeMounts: mounts}},
				},
			},
		},
	}, nil
}

func resources(r service.Resources) (corev1.ResourceRequirements, error) {
	out := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, f := range []struct {
		value string
		list  corev1.ResourceList
		name  corev1.ResourceName
	}{
		{r.CPURequest, out.Requests, corev1.ResourceCPU}, {r.MemoryRequest, out.Requests, corev1.ResourceMemory},
		{r.CPULimit, out.Limits, corev1.ResourceCPU}, {r.MemoryLimit, out.Limits, corev1.ResourceMemory},
	} {
		if f.value == "" {
			continue
		}
		q, err := resource.ParseQuantity(f.value)
		if err != nil {
			return out, fmt.Errorf("spec.resources: %q: %w", f.value, err)
		}
		f.list[f.name] = q
	}
	return out, nil
}

func claimClass(s *appsv1.StatefulSet) string {
	for _, c := range s.Spec.VolumeClaimTemplates {
		if c.Name == "data" {
			return ptr.Deref(c.Spec.StorageClassName, "")
		}
	}
	return ""
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func apiMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Message
	}
	return err.Error()
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
