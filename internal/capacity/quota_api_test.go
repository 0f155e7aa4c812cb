package capacity_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/capacity"
	"kipper.run/kip/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const highPriority = "kip-test-high"

// quotaPod is a pod like the copy pod (100m CPU, 1 GiB of memory requested and limited), changed
// by edit.
func quotaPod(name string, edit func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "mover", Image: "busybox",
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
		},
	}}}}
	if edit != nil {
		edit(p)
	}
	return p
}

func scoped(scopes ...corev1.ResourceQuotaScope) corev1.ResourceQuotaSpec {
	return corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}, Scopes: scopes}
}

func priority(op corev1.ScopeSelectorOperator, values ...string) corev1.ResourceQuotaSpec {
	return corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
		ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{
			{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: op, Values: values}}}}
}

func hard(pairs ...string) corev1.ResourceQuotaSpec {
	l := corev1.ResourceList{}
	for i := 0; i < len(pairs); i += 2 {
		l[corev1.ResourceName(pairs[i])] = resource.MustParse(pairs[i+1])
	}
	return corev1.ResourceQuotaSpec{Hard: l}
}

// TestQuotaDecisionsMatchTheAPIServer compares CheckQuotas with the real API server's ResourceQuota
// admission (a dry-run create) for each pod under each quota: every scope and operator, a limit
// on memory the copy pod exceeds, and a limit on CPU limits the copy pod does not set.
func TestQuotaDecisionsMatchTheAPIServer(t *testing.T) {
	e := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: highPriority}, Value: 1000}
	if _, err := e.Kube.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pods := []*corev1.Pod{
		quotaPod("copy", nil),
		quotaPod("best-effort", func(p *corev1.Pod) { p.Spec.Containers[0].Resources = corev1.ResourceRequirements{} }),
		quotaPod("terminating", func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = ptr.To[int64](600) }),
		quotaPod("high-priority", func(p *corev1.Pod) { p.Spec.PriorityClassName = highPriority }),
		quotaPod("cross-namespace", func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
				Weight: 1, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname", NamespaceSelector: &metav1.LabelSelector{}},
			}}}}
		}),
		quotaPod("cpu-limited", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
		}),
	}
	quotas := map[string]corev1.ResourceQuotaSpec{
		"terminating":         scoped(corev1.ResourceQuotaScopeTerminating),
		"not-terminating":     scoped(corev1.ResourceQuotaScopeNotTerminating),
		"best-effort":         scoped(corev1.ResourceQuotaScopeBestEffort),
		"not-best-effort":     scoped(corev1.ResourceQuotaScopeNotBestEffort),
		"cross-namespace":     scoped(corev1.ResourceQuotaScopeCrossNamespacePodAffinity),
		"two-scopes":          scoped(corev1.ResourceQuotaScopeNotTerminating, corev1.ResourceQuotaScopeNotBestEffort),
		"priority-in":         priority(corev1.ScopeSelectorOpIn, highPriority),
		"priority-not-in":     priority(corev1.ScopeSelectorOpNotIn, highPriority),
		"priority-exists":     priority(corev1.ScopeSelectorOpExists),
		"priority-not-exists": priority(corev1.ScopeSelectorOpDoesNotExist),
		"memory-512mi":        hard("requests.memory", "512Mi"),
		"memory-2gi":          hard("memory", "2Gi", "limits.memory", "2Gi"),
		"cpu-limits":          hard("limits.cpu", "2"),
		"pods-count":          hard("count/pods", "1"),
		"best-effort-pods-5":  {Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("5")}, Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeBestEffort}},
	}
	for name, spec := range quotas {
		t.Run(name, func(t *testing.T) {
			ns := e.Namespace(t)
			q := createQuota(ctx, t, e.Kube, ns, name, spec)
			for _, p := range pods {
				_, err := e.Kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if err != nil && !apierrors.IsForbidden(err) {
					t.Fatalf("dry-run create of %s: %v", p.Name, err)
				}
				mine := capacity.CheckQuotas([]corev1.ResourceQuota{*q}, p, nil)
				if (err == nil) != (mine == nil) {
					t.Errorf("pod %s: the API server says %v, kip says %v", p.Name, orAdmitted(err), orAdmitted(mine))
				}
				if mine != nil && !strings.Contains(mine.Error(), "ResourceQuota "+name) {
					t.Errorf("pod %s: kip's refusal does not name the quota: %v", p.Name, mine)
				}
			}
		})
	}
}

// The service's own pods, which the move stops first, do not count against the copy pod: kip
// admits what the API server admits once they are gone.
func TestQuotaCountsTheServiceAsGone(t *testing.T) {
	e := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := e.Namespace(t)
	q := createQuota(ctx, t, e.Kube, ns, "memory", hard("requests.memory", "1536Mi"))
	service, err := e.Kube.CoreV1().Pods(ns).Create(ctx, quotaPod("db-0", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q = waitUsed(ctx, t, e.Kube, ns, q.Name, corev1.ResourceRequestsMemory, "1Gi")
	copyPod := quotaPod("copy", nil)
	if _, err := e.Kube.CoreV1().Pods(ns).Create(ctx, copyPod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Fatalf("the API server admits the copy pod beside the service (%v); the test means nothing", err)
	}
	if err := capacity.CheckQuotas([]corev1.ResourceQuota{*q}, copyPod, nil); err == nil || !strings.Contains(err.Error(), "allows 1536Mi of requests.memory") {
		t.Errorf("with the service running kip says %v, want the memory refusal", orAdmitted(err))
	}
	if err := capacity.CheckQuotas([]corev1.ResourceQuota{*q}, copyPod, []corev1.Pod{*service}); err != nil {
		t.Fatalf("with the service gone kip refuses: %v", err)
	}
	if err := e.Kube.CoreV1().Pods(ns).Delete(ctx, service.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitUsed(ctx, t, e.Kube, ns, q.Name, corev1.ResourceRequestsMemory, "0")
	if _, err := e.Kube.CoreV1().Pods(ns).Create(ctx, copyPod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("with the service gone the API server refuses the copy pod: %v", err)
	}
}

func orAdmitted(err error) string {
	if err == nil {
		return "admitted"
	}
	return err.Error()
}

// createQuota creates a quota and waits until the quota controller has counted its use.
func createQuota(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, name string, spec corev1.ResourceQuotaSpec) *corev1.ResourceQuota {
	t.Helper()
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	if _, err := c.CoreV1().ResourceQuotas(ns).Create(ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.ResourceQuota
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = c.CoreV1().ResourceQuotas(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && len(got.Status.Used) == len(spec.Hard), err
	})
	if err != nil {
		t.Fatalf("quota %s: its use was never counted: %v", name, err)
	}
	return got
}

// waitUsed waits until the quota has counted want of resource.
func waitUsed(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, name string, r corev1.ResourceName, want string) *corev1.ResourceQuota {
	t.Helper()
	var got *corev1.ResourceQuota
	w := resource.MustParse(want)
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = c.CoreV1().ResourceQuotas(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		u, ok := got.Status.Used[r]
		return ok && u.Cmp(w) == 0, nil
	})
	if err != nil {
		t.Fatalf("quota %s never counted %s %s: %v", name, want, r, err)
	}
	return got
}

func limitRange(items ...corev1.LimitRangeItem) corev1.LimitRangeSpec {
	return corev1.LimitRangeSpec{Limits: items}
}

// TestLimitRangesMatchTheAPIServer compares ApplyLimitRanges with the real API server's
// LimitRanger admission (a dry-run create, which returns the pod as admission left it): which
// pods it refuses, and the requests and limits it gives the ones it admits.
func TestLimitRangesMatchTheAPIServer(t *testing.T) {
	e := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pods := []*corev1.Pod{
		quotaPod("copy", nil),
		quotaPod("best-effort", func(p *corev1.Pod) { p.Spec.Containers[0].Resources = corev1.ResourceRequirements{} }),
		quotaPod("cpu-limited", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
		}),
		quotaPod("two-containers", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, *p.Spec.Containers[0].DeepCopy())
			p.Spec.Containers[1].Name = "second"
		}),
	}
	ranges := map[string]corev1.LimitRangeSpec{
		"defaults": limitRange(corev1.LimitRangeItem{Type: corev1.LimitTypeContainer,
			Default: requests("500m", "512Mi"), DefaultRequest: requests("250m", "256Mi")}),
		"default-limit-only": limitRange(corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, Default: requests("2", "2Gi")}),
		"max-memory":         limitRange(corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, Max: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}}),
		"max-cpu":            limitRange(corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, Max: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}),
		"min-memory":         limitRange(corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, Min: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}),
		"ratio":              limitRange(corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, MaxLimitRequestRatio: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}}),
		"pod-max":            limitRange(corev1.LimitRangeItem{Type: corev1.LimitTypePod, Max: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1536Mi")}}),
		"defaults-then-max": limitRange(
			corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, Default: requests("1", "1Gi"), Max: requests("2", "1Gi")}),
	}
	refused, admitted := 0, 0
	t.Cleanup(func() {
		if refused == 0 || admitted == 0 {
			t.Errorf("the API server refused %d and admitted %d of the pods: the table tests only one side", refused, admitted)
		}
	})
	for name, spec := range ranges {
		t.Run(name, func(t *testing.T) {
			ns := e.Namespace(t)
			if _, err := e.Kube.CoreV1().LimitRanges(ns).Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			lrs, err := e.Kube.CoreV1().LimitRanges(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods {
				got, err := e.Kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if err != nil && !apierrors.IsForbidden(err) {
					t.Fatalf("dry-run create of %s: %v", p.Name, err)
				}
				if err != nil {
					refused++
				} else {
					admitted++
				}
				mine, merr := capacity.ApplyLimitRanges(lrs.Items, p)
				if (err == nil) != (merr == nil) {
					t.Errorf("pod %s: the API server says %v, kip says %v", p.Name, orAdmitted(err), orAdmitted(merr))
					continue
				}
				if merr != nil {
					if !strings.Contains(merr.Error(), "LimitRange "+name) {
						t.Errorf("pod %s: kip's refusal does not name the LimitRange: %v", p.Name, merr)
					}
					continue
				}
				for i, c := range got.Spec.Containers {
					if !sameResources(c.Resources.Requests, mine.Spec.Containers[i].Resources.Requests) || !sameResources(c.Resources.Limits, mine.Spec.Containers[i].Resources.Limits) {
						t.Errorf("pod %s container %s: the API server gives %v, kip %v", p.Name, c.Name, c.Resources, mine.Spec.Containers[i].Resources)
					}
				}
			}
		})
	}
}

func requests(cpu, mem string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
}

func sameResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for n, q := range a {
		if o, ok := b[n]; !ok || q.Cmp(o) != 0 {
			return false
		}
	}
	return true
}

// TestClaimQuotaDecisionsMatchTheAPIServer compares CheckClaimQuotas with the API server's
// ResourceQuota admission of the move's new claim (a dry-run create), for quotas on claims in all
// and on the class's, with room and without, and with scopes that do not count claims.
func TestClaimQuotaDecisionsMatchTheAPIServer(t *testing.T) {
	e := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const class = "kipper-longhorn-1"
	classed := func(r string) string { return class + ".storageclass.storage.k8s.io/" + r }
	quotas := map[string]corev1.ResourceQuotaSpec{
		"claims-0":          hard("persistentvolumeclaims", "0"),
		"claims-1":          hard("persistentvolumeclaims", "1"),
		"storage-1gi":       hard("requests.storage", "1Gi"),
		"storage-2gi":       hard("requests.storage", "2Gi"),
		"class-storage-1gi": hard(classed("requests.storage"), "1Gi"),
		"class-claims-0":    hard(classed("persistentvolumeclaims"), "0"),
		"other-class-0":     hard("local-path.storageclass.storage.k8s.io/persistentvolumeclaims", "0"),
		"pod-scope":         scoped(corev1.ResourceQuotaScopeTerminating),
		"vac-not-exists": {Hard: corev1.ResourceList{corev1.ResourcePersistentVolumeClaims: resource.MustParse("0")},
			ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{ScopeName: corev1.ResourceQuotaScopeVolumeAttributesClass, Operator: corev1.ScopeSelectorOpDoesNotExist}}}},
		"vac-exists": {Hard: corev1.ResourceList{corev1.ResourcePersistentVolumeClaims: resource.MustParse("0")},
			ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{ScopeName: corev1.ResourceQuotaScopeVolumeAttributesClass, Operator: corev1.ScopeSelectorOpExists}}}},
	}
	for name, spec := range quotas {
		t.Run(name, func(t *testing.T) {
			ns := e.Namespace(t)
			q, err := e.Kube.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				q, err = e.Kube.CoreV1().ResourceQuotas(ns).Get(ctx, name, metav1.GetOptions{})
				return err == nil && len(q.Status.Used) == len(spec.Hard), err
			}); err != nil {
				t.Fatalf("quota %s: its use was never counted: %v", name, err)
			}
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kip-move-db", Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(class),
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}}}}
			_, apiErr := e.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if apiErr != nil && !apierrors.IsForbidden(apiErr) {
				t.Fatalf("dry-run create: %v", apiErr)
			}
			mine := capacity.CheckClaimQuotas([]corev1.ResourceQuota{*q}, class, 2<<30)
			if (apiErr == nil) != (mine == nil) {
				t.Errorf("the API server says %v, kip says %v", orAdmitted(apiErr), orAdmitted(mine))
			}
			if mine != nil && !strings.Contains(mine.Error(), "ResourceQuota "+name) {
				t.Errorf("kip's refusal does not name the quota: %v", mine)
			}
		})
	}
}
