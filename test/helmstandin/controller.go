// Package helmstandin is the stand-in of k3s's embedded helm-controller (github.com/k3s-io/helm-controller),
// for tests only: the k3s stand-in runs it, and API tests run it in their own process against
// the test environment's API server.
package helmstandin

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	"github.com/k3s-io/helm-controller/pkg/crds"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"kipper.run/kip/test/controlplane"
)

// k3s embeds github.com/k3s-io/helm-controller, which turns each helm.cattle.io/v1 HelmChart
// into a Job, helm-install-<name>, whose klipper-helm container runs helm. The stand-in keeps
// the same objects in the API (the CRDs, the Job, the chart's status), and the Job's Pod (the
// lab's stand-in klipper-helm image, or kwok) completes; no helm runs, so a chart installs
// nothing. What a chart would have created can be given as fixture files instead (see
// applyFixtures). See docs/k3s-standin.md.

const (
	// FieldManager applies chart fixtures; the controller's own writes carry it as their
	// user agent.
	FieldManager = "k3s-standin-helm"

	// LabelChartName, AnnotationConfigHash and AnnotationUnmanaged are as helm-controller
	// v0.17.9's pkg/controllers/chart names them.
	LabelChartName       = "helmcharts.helm.cattle.io/chart"
	AnnotationConfigHash = "helmcharts.helm.cattle.io/configHash"
	AnnotationUnmanaged  = "helmcharts.helm.cattle.io/unmanaged"

	// JobImage is the job image of helm-controller v0.17.9's own deployment
	// (manifests/deployment.yaml), named as k3s names its images. Its code's default is
	// rancher/klipper-helm:latest; k3s sets its bundled release.
	JobImage = "rancher/klipper-helm:v0.9.10-build20251111"

	// helmResync is how often every HelmChart is looked at again, whatever changed.
	helmResync = 30 * time.Second
	// helmWorkers is how many charts are handled at once: a chart whose fixtures hold CRDs
	// waits for them.
	helmWorkers = 4
	// helmSyncTimeout bounds one chart's handling, fixtures and CRD waits included.
	helmSyncTimeout = 2 * time.Minute
)

// ChartResource is the HelmCharts' resource.
var ChartResource = helmv1.SchemeGroupVersion.WithResource(helmv1.HelmChartResourceName)

// EnsureCRDs creates the HelmChart and HelmChartConfig CRDs, or updates them to
// helm-controller's, and returns their names.
func EnsureCRDs(ctx context.Context, ext apiextensionsclientset.Interface) ([]string, error) {
	list, err := crds.List()
	if err != nil {
		return nil, fmt.Errorf("read helm-controller's CRDs: %w", err)
	}
	crdClient := ext.ApiextensionsV1().CustomResourceDefinitions()
	var names []string
	for _, crd := range list {
		cur, err := crdClient.Get(ctx, crd.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = crdClient.Create(ctx, crd, metav1.CreateOptions{})
		case err == nil:
			crd.ResourceVersion = cur.ResourceVersion
			_, err = crdClient.Update(ctx, crd, metav1.UpdateOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	return names, nil
}

// CRDsEstablished checks that the named CRDs are Established.
func CRDsEstablished(ctx context.Context, ext apiextensionsclientset.Interface, names []string) error {
	for _, name := range names {
		crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		established := false
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				established = true
			}
		}
		if !established {
			return fmt.Errorf("CRD %s is not Established yet", name)
		}
	}
	return nil
}

// Controller handles HelmCharts in all namespaces, as k3s's embedded helm-controller does.
type Controller struct {
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	ext      apiextensionsclientset.Interface
	applier  *Applier
	fixtures string // the k3s stand-in's <data-dir>/server/standin-charts, or ""
	log      *slog.Logger
	queue    workqueue.TypedRateLimitingInterface[cache.ObjectName]
	charts   cache.GenericLister
}

// New returns a controller acting with cfg's credentials, taking chart fixtures from the
// directory fixtures ("" for none) and logging to log.
func New(cfg *rest.Config, fixtures string, log *slog.Logger) (*Controller, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = FieldManager
	cfg.Timeout = 0              // watches last; each chart's handling has its own deadline
	cfg.QPS, cfg.Burst = 50, 100 // fixtures can be many objects (a chart's CRDs)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("helm-controller client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("helm-controller client: %w", err)
	}
	ext, err := apiextensionsclientset.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("helm-controller client: %w", err)
	}
	return &Controller{
		kube:     kube,
		dyn:      dyn,
		ext:      ext,
		applier:  NewApplier(dyn, kube.Discovery()),
		fixtures: fixtures,
		log:      log,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](100*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: "helmcharts"}),
	}, nil
}

// Applier is the controller's applier, which applies chart fixtures.
func (h *Controller) Applier() *Applier { return h.applier }

// Run handles HelmCharts until ctx ends, then returns once its goroutines have.
func (h *Controller) Run(ctx context.Context) {
	chartInformers := dynamicinformer.NewDynamicSharedInformerFactory(h.dyn, helmResync)
	charts := chartInformers.ForResource(ChartResource)
	h.charts = charts.Lister()
	// The charts' Jobs, so that a deleted Job comes back at once, as with helm-controller.
	jobInformers := informers.NewSharedInformerFactoryWithOptions(h.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelChartName }))
	jobs := jobInformers.Batch().V1().Jobs().Informer()
	_, errCharts := charts.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    h.enqueue,
		UpdateFunc: func(_, obj any) { h.enqueue(obj) },
	})
	_, errJobs := jobs.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: h.jobDeleted})
	if err := errors.Join(errCharts, errJobs); err != nil {
		h.log.Error("watch HelmCharts", "err", err)
		return
	}
	chartInformers.Start(ctx.Done())
	jobInformers.Start(ctx.Done())
	var workers sync.WaitGroup
	if cache.WaitForCacheSync(ctx.Done(), charts.Informer().HasSynced, jobs.HasSynced) {
		for range helmWorkers {
			workers.Go(func() {
				for h.next(ctx) {
				}
			})
		}
	}
	<-ctx.Done()
	h.queue.ShutDown()
	workers.Wait()
	chartInformers.Shutdown()
	jobInformers.Shutdown()
}

func (h *Controller) enqueue(obj any) {
	name, err := cache.ObjectToName(obj)
	if err != nil {
		h.log.Error("queue HelmChart", "err", err)
		return
	}
	h.queue.Add(name)
}

func (h *Controller) jobDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if job, ok := obj.(*batchv1.Job); ok && job.Labels[LabelChartName] != "" {
		h.queue.Add(cache.ObjectName{Namespace: job.Namespace, Name: job.Labels[LabelChartName]})
	}
}

// next handles one queued chart; it returns false once the queue is shut down.
func (h *Controller) next(ctx context.Context) bool {
	key, quit := h.queue.Get()
	if quit {
		return false
	}
	defer h.queue.Done(key)
	sctx, cancel := context.WithTimeout(ctx, helmSyncTimeout)
	defer cancel()
	if err := h.sync(sctx, key); err != nil {
		if ctx.Err() == nil {
			if !apierrors.IsConflict(err) { // the chart changed meanwhile: just try again
				h.log.Error("handle HelmChart", "chart", key.String(), "err", err)
			}
			h.queue.AddRateLimited(key)
		}
		return true
	}
	h.queue.Forget(key)
	return true
}

// sync brings a chart's Job and status in line with its spec: when the Job is missing, was made
// for another spec (its config hash differs) or belongs to an earlier chart of the same name, the
// chart is installed again.
func (h *Controller) sync(ctx context.Context, key cache.ObjectName) error {
	obj, err := h.charts.ByNamespace(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil // deleted: its Job goes with it (ownerReference)
	}
	if err != nil {
		return err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("unexpected object %T", obj)
	}
	chart := &helmv1.HelmChart{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, chart); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if !shouldManage(chart) {
		return nil
	}
	want := helmJob(chart)
	cur, err := h.kube.BatchV1().Jobs(chart.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cur = nil
	} else if err != nil {
		return err
	}
	if cur == nil || cur.DeletionTimestamp != nil || !metav1.IsControlledBy(cur, chart) ||
		cur.Spec.Template.Annotations[AnnotationConfigHash] != want.Spec.Template.Annotations[AnnotationConfigHash] {
		// The charts' cache can be behind the Jobs': a chart deleted a moment ago deletes its
		// Job, whose deletion brings the chart here again from a cache that still holds it. Only
		// a chart the API still has is installed (helm-controller never installs a deleted chart:
		// its finalizer holds the chart until it has uninstalled it).
		live, err := h.dyn.Resource(ChartResource).Namespace(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && (live.GetUID() != chart.UID || live.GetDeletionTimestamp() != nil) {
			return nil // a later event brings the chart as it is
		}
		if err != nil {
			return err
		}
		if err := h.install(ctx, chart, cur, want); err != nil {
			return err
		}
	}
	return h.setStatus(ctx, u, chart, want.Name)
}

// shouldManage is helm-controller's test: a chart to install, not marked unmanaged, not being
// deleted.
func shouldManage(chart *helmv1.HelmChart) bool {
	_, unmanaged := chart.Annotations[AnnotationUnmanaged]
	return (chart.Spec.Chart != "" || chart.Spec.ChartContent != "") && !unmanaged && chart.DeletionTimestamp == nil
}

// install does what the chart's install Job stands for: it creates the target namespace when the
// chart asks for it and applies the chart's fixtures; then it replaces the Job old (nil when
// there is none) with want.
func (h *Controller) install(ctx context.Context, chart *helmv1.HelmChart, old, want *batchv1.Job) error {
	target := targetNamespace(chart)
	if chart.Spec.CreateNamespace {
		// As helm's --create-namespace.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: target, Labels: map[string]string{"name": target}}}
		if _, err := h.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", target, err)
		}
	}
	if err := h.applyFixtures(ctx, chart, target); err != nil {
		return err
	}
	if err := h.ensureServiceAccount(ctx, chart, want); err != nil {
		return err
	}
	jobs := h.kube.BatchV1().Jobs(chart.Namespace)
	if old != nil {
		err := jobs.Delete(ctx, old.Name, metav1.DeleteOptions{
			PropagationPolicy: ptr.To(metav1.DeletePropagationBackground),
			Preconditions:     metav1.NewUIDPreconditions(string(old.UID)),
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete job %s: %w", old.Name, err)
		}
		if err := controlplane.Poll(ctx, 100*time.Millisecond, nil, nil, func(ctx context.Context) error {
			j, err := jobs.Get(ctx, old.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && j.UID != old.UID) {
				return nil
			}
			return fmt.Errorf("job %s is still there: %v", old.Name, err)
		}); err != nil {
			return err
		}
	}
	if _, err := jobs.Create(ctx, want, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create job %s: %w", want.Name, err)
	}
	h.log.Info("applying HelmChart", "chart", chart.Namespace+"/"+chart.Name, "job", want.Name,
		"hash", want.Spec.Template.Annotations[AnnotationConfigHash], "replaced", old != nil)
	return nil
}

// ensureServiceAccount creates the service account the Job's Pods run as (the ServiceAccount
// admission plugin refuses Pods without it), owned by the chart like the Job; one left by an
// earlier chart of the same name is taken over before the garbage collector removes it.
func (h *Controller) ensureServiceAccount(ctx context.Context, chart *helmv1.HelmChart, job *batchv1.Job) error {
	sas := h.kube.CoreV1().ServiceAccounts(chart.Namespace)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
		Name: job.Spec.Template.Spec.ServiceAccountName, Namespace: chart.Namespace, OwnerReferences: job.OwnerReferences,
	}}
	_, err := sas.Create(ctx, sa, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := sas.Get(ctx, sa.Name, metav1.GetOptions{})
		if gerr != nil || metav1.IsControlledBy(cur, chart) {
			err = gerr
		} else {
			cur.OwnerReferences = job.OwnerReferences
			_, err = sas.Update(ctx, cur, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("service account %s: %w", sa.Name, err)
	}
	return nil
}

// setStatus records the chart's Job and JobCreated condition, as helm-controller does.
func (h *Controller) setStatus(ctx context.Context, u *unstructured.Unstructured, chart *helmv1.HelmChart, job string) error {
	want := helmv1.HelmChartStatus{
		JobName: job,
		Conditions: []helmv1.HelmChartCondition{
			{Type: helmv1.HelmChartJobCreated, Status: corev1.ConditionTrue, Reason: "Job created",
				Message: fmt.Sprintf("Applying HelmChart using Job %s/%s", chart.Namespace, job)},
			{Type: helmv1.HelmChartFailed, Status: corev1.ConditionFalse},
		},
	}
	if equality.Semantic.DeepEqual(chart.Status, want) {
		return nil
	}
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&want)
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	u = u.DeepCopy()
	u.Object["status"] = status
	if _, err := h.dyn.Resource(ChartResource).Namespace(chart.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status: %w", err)
	}
	return nil
}

func targetNamespace(chart *helmv1.HelmChart) string {
	if chart.Spec.TargetNamespace != "" {
		return chart.Spec.TargetNamespace
	}
	return chart.Namespace
}

// SpecHash is the Job's configHash annotation: a SHA-256 of the chart's spec. (helm-controller
// hashes the Job's pod template and the values it mounts; either way, a new spec is a new hash.)
func SpecHash(spec helmv1.HelmChartSpec) string {
	data, _ := json.Marshal(spec) // plain data: it always encodes
	return fmt.Sprintf("SHA256=%X", sha256.Sum256(data))
}

// helmJob is the install Job helm-controller would create for chart, without the values,
// content and credential volumes (the stand-in creates no values Secret), security contexts and
// the suspend-then-resume dance.
func helmJob(chart *helmv1.HelmChart) *batchv1.Job {
	s := chart.Spec
	image := strings.TrimSpace(s.JobImage)
	if image == "" {
		image = JobImage
	}
	chartRef := s.Chart
	if s.Repo != "" {
		chartRef = chart.Name + "/" + s.Chart
	}
	driver, failurePolicy, serverSide := string(s.Driver), string(s.FailurePolicy), string(s.ServerSide)
	if driver == "" {
		driver = string(helmv1.HelmDriverSecret)
	}
	if failurePolicy == "" {
		failurePolicy = string(helmv1.FailurePolicyReinstall)
	}
	if serverSide == "" {
		serverSide = string(helmv1.ServerSideAuto)
	}
	backoff := ptr.To(int32(1000))
	if s.BackOffLimit != nil {
		backoff = s.BackOffLimit
	}
	args := []string{"install"}
	if s.TargetNamespace != "" {
		args = append(args, "--namespace", s.TargetNamespace)
	}
	if s.CreateNamespace {
		args = append(args, "--create-namespace")
	}
	if s.TakeOwnership {
		args = append(args, "--take-ownership")
	}
	if s.Version != "" {
		args = append(args, "--version", s.Version)
	}
	labels := map[string]string{LabelChartName: chart.Name}
	pod := corev1.PodSpec{
		RestartPolicy:      corev1.RestartPolicyOnFailure,
		ServiceAccountName: "helm-" + chart.Name,
		PriorityClassName:  "system-cluster-critical",
		NodeSelector:       map[string]string{corev1.LabelOSStable: "linux"},
		Containers: []corev1.Container{{
			Name:            "helm",
			Image:           image,
			ImagePullPolicy: corev1.PullIfNotPresent,
			Args:            args,
			Env: []corev1.EnvVar{
				{Name: "NAME", Value: chart.Name},
				{Name: "VERSION", Value: s.Version},
				{Name: "REPO", Value: s.Repo},
				{Name: "HELM_DRIVER", Value: driver},
				{Name: "CHART_NAMESPACE", Value: chart.Namespace},
				{Name: "CHART", Value: chartRef},
				{Name: "HELM_VERSION", Value: s.HelmVersion},
				{Name: "TARGET_NAMESPACE", Value: targetNamespace(chart)},
				{Name: "AUTH_PASS_CREDENTIALS", Value: fmt.Sprint(s.AuthPassCredentials)},
				{Name: "INSECURE_SKIP_TLS_VERIFY", Value: fmt.Sprint(s.InsecureSkipTLSVerify)},
				{Name: "PLAIN_HTTP", Value: fmt.Sprint(s.PlainHTTP)},
				{Name: "FAILURE_POLICY", Value: failurePolicy},
				{Name: "SERVER_SIDE", Value: serverSide},
				{Name: "FORCE_CONFLICTS", Value: fmt.Sprint(s.ForceConflicts)},
			},
		}},
	}
	controlPlane := "node-role.kubernetes.io/control-plane"
	if s.Bootstrap {
		// Bootstrap charts (CNI, cloud provider) run on a server, on the host network.
		pod.NodeSelector[controlPlane] = "true"
		pod.HostNetwork = true
		pod.Tolerations = []corev1.Toleration{
			{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule},
			{Key: corev1.TaintNodeNetworkUnavailable, Effect: corev1.TaintEffectNoSchedule},
			{Key: "node.cloudprovider.kubernetes.io/uninitialized", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule},
			{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
			{Key: "node-role.kubernetes.io/etcd", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
			{Key: controlPlane, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		}
		pod.Containers[0].Env = append(pod.Containers[0].Env, corev1.EnvVar{Name: "BOOTSTRAP", Value: "true"})
	} else {
		pod.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
				Weight: 100,
				Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: controlPlane, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}},
				}},
			}},
		}}
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "helm-install-" + chart.Name,
			Namespace: chart.Namespace,
			Labels:    labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         helmv1.SchemeGroupVersion.String(),
				Kind:               "HelmChart",
				Name:               chart.Name,
				UID:                chart.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: batchv1.JobSpec{
			BackoffLimit: backoff,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      labels,
					Annotations: map[string]string{AnnotationConfigHash: SpecHash(s)},
				},
				Spec: pod,
			},
		},
	}
}

// applyFixtures stands in for what the chart would create: the objects in every *.yaml file of
// the directory named after the chart (or of its subdirectory named after the chart's
// spec.version, when there is one: a chart whose releases differ), applied server-side as helm
// would have installed them
// (namespaced objects without a namespace go to the target namespace, and carry helm's release
// label and annotations). Namespaces and CRDs go first, and the rest waits until the CRDs are
// Established, since it may hold their custom resources. No directory, no fixtures. Test only.
func (h *Controller) applyFixtures(ctx context.Context, chart *helmv1.HelmChart, target string) error {
	if h.fixtures == "" {
		return nil
	}
	dir := filepath.Join(h.fixtures, chart.Name)
	if v := chart.Spec.Version; v != "" && filepath.Base(v) == v {
		if st, err := os.Stat(filepath.Join(dir, v)); err == nil && st.IsDir() {
			dir = filepath.Join(dir, v)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml")) // in name order
	if err != nil || len(files) == 0 {
		return err
	}
	var first, rest []*unstructured.Unstructured
	var crdNames []string
	for _, f := range files {
		objs, err := ReadObjects(f)
		if err != nil {
			return fmt.Errorf("chart fixture %s: %w", f, err)
		}
		for _, o := range objs {
			switch o.GroupVersionKind().GroupKind() {
			case apiextensionsv1.Kind("CustomResourceDefinition"):
				crdNames = append(crdNames, o.GetName())
				first = append(first, o)
			case corev1.SchemeGroupVersion.WithKind("Namespace").GroupKind():
				first = append(first, o)
			default:
				rest = append(rest, o)
			}
		}
	}
	for _, o := range first {
		if err := h.apply(ctx, chart, target, o); err != nil {
			return err
		}
	}
	if len(crdNames) > 0 {
		if err := controlplane.Poll(ctx, 100*time.Millisecond, nil, nil, func(ctx context.Context) error {
			return CRDsEstablished(ctx, h.ext, crdNames)
		}); err != nil {
			return fmt.Errorf("chart fixtures' CRDs: %w", err)
		}
	}
	for _, o := range rest {
		if err := h.apply(ctx, chart, target, o); err != nil {
			return err
		}
	}
	h.log.Info("applied chart fixtures", "chart", chart.Namespace+"/"+chart.Name, "dir", dir, "objects", len(first)+len(rest))
	return nil
}

// apply applies o server-side with FieldManager, taking conflicts, as helm's server-side
// apply with --force-conflicts would, with what helm puts on every object of a release.
func (h *Controller) apply(ctx context.Context, chart *helmv1.HelmChart, target string, o *unstructured.Unstructured) error {
	labels := o.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels["app.kubernetes.io/managed-by"] = "Helm"
	o.SetLabels(labels)
	annotations := o.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations["meta.helm.sh/release-name"] = chart.Name
	annotations["meta.helm.sh/release-namespace"] = target
	o.SetAnnotations(annotations)
	if err := h.applier.Apply(ctx, o, target, FieldManager); err != nil {
		return fmt.Errorf("chart fixture: %w", err)
	}
	return nil
}
