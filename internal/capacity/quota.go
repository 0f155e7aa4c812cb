// Package capacity decides whether pods and claims fit a node and a namespace: the room on a node
// (its allocatable less the requests of its pods), the namespace's ResourceQuotas and its
// LimitRanges, each as the scheduler or the API server's admission would decide.
package capacity

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	resourcehelper "k8s.io/component-helpers/resource"
)

// CheckQuotas refuses, naming the quota, when a ResourceQuota of the namespace would not admit pod
// once the pods in gone (the service's, which the move stops first) no longer count. It
// evaluates quotas as the API server's ResourceQuota admission does (the pod evaluator of
// Kubernetes' quota package): a quota counts a pod when all its scopes cover it; the pod must
// then set every compute resource the quota limits in each container; and what the quota has
// used, less the gone pods it covers, plus the pod's use, must stay within each hard limit. A
// scope kip does not know refuses, naming the quota. pod must be as the namespace's LimitRanges
// leave it (ApplyLimitRanges), since the API server applies them first.
func CheckQuotas(quotas []corev1.ResourceQuota, pod *corev1.Pod, gone []corev1.Pod) error {
	for i := range quotas {
		q := &quotas[i]
		covers, err := quotaCovers(q, pod)
		if err != nil {
			return err
		}
		if !covers {
			continue
		}
		if missing := missingConstraints(q, pod); missing != "" {
			return fmt.Errorf("ResourceQuota %s in %s requires every container to set %s, which pod %s does not", q.Name, q.Namespace, missing, pod.Name)
		}
		use := PodUsage(pod)
		for _, name := range sortedNames(q.Spec.Hard) {
			need, ok := use[name]
			if !ok {
				continue
			}
			used, ok := q.Status.Used[name]
			if !ok {
				return fmt.Errorf("ResourceQuota %s in %s has not counted its use of %s yet: run the command again in a minute", q.Name, q.Namespace, name)
			}
			used = used.DeepCopy()
			for j := range gone {
				if c, err := quotaCovers(q, &gone[j]); err != nil || !c || terminal(&gone[j]) {
					continue
				}
				if g, ok := PodUsage(&gone[j])[name]; ok {
					used.Sub(g)
				}
			}
			after := used.DeepCopy()
			after.Add(need)
			if hard := q.Spec.Hard[name]; after.Cmp(hard) > 0 {
				return fmt.Errorf("ResourceQuota %s in %s allows %s of %s; %s is used once the service's pods are gone, and pod %s needs %s more",
					q.Name, q.Namespace, hard.String(), name, used.String(), pod.Name, need.String())
			}
		}
	}
	return nil
}

func sortedNames(l corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// terminal reports whether a pod has ended: quotas no longer count it.
func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// quotaCovers reports whether every scope of q covers pod.
func quotaCovers(q *corev1.ResourceQuota, pod *corev1.Pod) (bool, error) {
	reqs := make([]corev1.ScopedResourceSelectorRequirement, 0, len(q.Spec.Scopes))
	for _, s := range q.Spec.Scopes {
		reqs = append(reqs, corev1.ScopedResourceSelectorRequirement{ScopeName: s, Operator: corev1.ScopeSelectorOpExists})
	}
	if q.Spec.ScopeSelector != nil {
		reqs = append(reqs, q.Spec.ScopeSelector.MatchExpressions...)
	}
	for _, r := range reqs {
		ok, err := scopeCovers(r, pod)
		if err != nil {
			return false, fmt.Errorf("ResourceQuota %s in %s has a scope kip cannot evaluate (%v): remove the scope, or lift the quota while the move runs", q.Name, q.Namespace, err)
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// scopeCovers evaluates one scope for a pod, as Kubernetes' podMatchesScopeFunc does.
func scopeCovers(r corev1.ScopedResourceSelectorRequirement, pod *corev1.Pod) (bool, error) {
	switch r.ScopeName {
	case corev1.ResourceQuotaScopeTerminating:
		return terminating(pod), nil
	case corev1.ResourceQuotaScopeNotTerminating:
		return !terminating(pod), nil
	case corev1.ResourceQuotaScopeBestEffort:
		return bestEffort(pod), nil
	case corev1.ResourceQuotaScopeNotBestEffort:
		return !bestEffort(pod), nil
	case corev1.ResourceQuotaScopeCrossNamespacePodAffinity:
		return crossNamespaceAffinity(pod), nil
	case corev1.ResourceQuotaScopePriorityClass:
		if r.Operator == corev1.ScopeSelectorOpExists {
			return pod.Spec.PriorityClassName != "", nil
		}
		op, ok := map[corev1.ScopeSelectorOperator]selection.Operator{
			corev1.ScopeSelectorOpIn: selection.In, corev1.ScopeSelectorOpNotIn: selection.NotIn,
			corev1.ScopeSelectorOpDoesNotExist: selection.DoesNotExist,
		}[r.Operator]
		if !ok {
			return false, fmt.Errorf("scope %s with operator %s", r.ScopeName, r.Operator)
		}
		req, err := labels.NewRequirement(string(r.ScopeName), op, r.Values)
		if err != nil {
			return false, fmt.Errorf("scope %s: %w", r.ScopeName, err)
		}
		set := labels.Set{} // a pod without a priority class has no such key (DoesNotExist, NotIn)
		if pod.Spec.PriorityClassName != "" {
			set[string(r.ScopeName)] = pod.Spec.PriorityClassName
		}
		return req.Matches(set), nil
	case corev1.ResourceQuotaScopeVolumeAttributesClass:
		return false, nil // it covers claims only
	}
	return false, fmt.Errorf("scope %s", r.ScopeName)
}

func terminating(p *corev1.Pod) bool {
	return p.Spec.ActiveDeadlineSeconds != nil && *p.Spec.ActiveDeadlineSeconds >= 0
}

// bestEffort is the BestEffort QoS class: no container asks for or limits CPU or memory.
func bestEffort(p *corev1.Pod) bool {
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for _, l := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for n, q := range l {
				if (n == corev1.ResourceCPU || n == corev1.ResourceMemory) && !q.IsZero() {
					return false
				}
			}
		}
	}
	return true
}

func crossNamespaceAffinity(p *corev1.Pod) bool {
	a := p.Spec.Affinity
	if a == nil {
		return false
	}
	var terms []corev1.PodAffinityTerm
	if a.PodAffinity != nil {
		terms = append(terms, a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
	}
	if a.PodAntiAffinity != nil {
		terms = append(terms, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
	}
	return slices.ContainsFunc(terms, func(t corev1.PodAffinityTerm) bool { return len(t.Namespaces) > 0 || t.NamespaceSelector != nil })
}

// PodUsage is what quotas count of a pod: the pod itself, and its requests and limits under the
// names quotas give them (cpu and requests.cpu, limits.cpu, …).
func PodUsage(p *corev1.Pod) corev1.ResourceList {
	out := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1"), "count/pods": resource.MustParse("1")}
	addUsage(out, resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}), resourcehelper.PodLimits(p, resourcehelper.PodResourcesOptions{}))
	return out
}

// addUsage names requests and limits as quotas count them.
func addUsage(out, requests, limits corev1.ResourceList) {
	for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		if q, ok := requests[n]; ok {
			out[n], out[corev1.DefaultResourceRequestsPrefix+n] = q, q
		}
		if q, ok := limits[n]; ok {
			out[corev1.ResourceName("limits.")+n] = q
		}
	}
	for n, q := range requests {
		switch {
		case strings.HasPrefix(string(n), corev1.ResourceHugePagesPrefix):
			out[n], out[corev1.DefaultResourceRequestsPrefix+n] = q, q
		case strings.Contains(string(n), "/") && !strings.HasPrefix(string(n), corev1.ResourceDefaultNamespacePrefix):
			out[corev1.DefaultResourceRequestsPrefix+n] = q // an extended resource
		}
	}
}

// constrained are the quota resources every container must set when a quota limits them (a rule
// Kubernetes keeps for compatibility).
var constrained = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceRequestsCPU,
	corev1.ResourceRequestsMemory, corev1.ResourceLimitsCPU, corev1.ResourceLimitsMemory}

// missingConstraints names the resources q limits that a container of pod does not set, with the
// containers, as the API server's refusal does ("limits.cpu for: mover"); "" when none.
func missingConstraints(q *corev1.ResourceQuota, pod *corev1.Pod) string {
	var parts []string
	for _, n := range constrained {
		if _, ok := q.Spec.Hard[n]; !ok {
			continue
		}
		var names []string
		for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
			use := corev1.ResourceList{}
			addUsage(use, c.Resources.Requests, c.Resources.Limits)
			if _, ok := use[n]; !ok {
				names = append(names, c.Name)
			}
		}
		if len(names) > 0 {
			parts = append(parts, string(n)+" for: "+strings.Join(names, ","))
		}
	}
	return strings.Join(parts, "; ")
}

// CheckClaimQuotas refuses, naming the quota, when the namespace's ResourceQuotas would not admit
// new claims of class with the sizes given: the count of claims and their storage requests, in
// all and for the class. A quota with a scope counts claims only with the VolumeAttributesClass
// scope (the others are pods' scopes); kip's claims name no VolumeAttributesClass.
func CheckClaimQuotas(quotas []corev1.ResourceQuota, class string, sizes ...int64) error {
	var storage resource.Quantity
	for _, s := range sizes {
		storage.Add(*resource.NewQuantity(s, resource.BinarySI))
	}
	count := *resource.NewQuantity(int64(len(sizes)), resource.DecimalSI)
	need := corev1.ResourceList{
		corev1.ResourcePersistentVolumeClaims: count,
		corev1.ResourceRequestsStorage:        storage,
		corev1.ResourceName(class + ".storageclass.storage.k8s.io/" + string(corev1.ResourcePersistentVolumeClaims)): count,
		corev1.ResourceName(class + ".storageclass.storage.k8s.io/" + string(corev1.ResourceRequestsStorage)):        storage,
	}
	for i := range quotas {
		q := &quotas[i]
		if covers, err := claimQuotaCovers(q); err != nil || !covers {
			if err != nil {
				return err
			}
			continue
		}
		for _, name := range sortedNames(q.Spec.Hard) {
			want, ok := need[name]
			if !ok {
				continue
			}
			used, ok := q.Status.Used[name]
			if !ok {
				return fmt.Errorf("ResourceQuota %s in %s has not counted its use of %s yet: run the command again in a minute", q.Name, q.Namespace, name)
			}
			after := used.DeepCopy()
			after.Add(want)
			if hard := q.Spec.Hard[name]; after.Cmp(hard) > 0 {
				return fmt.Errorf("ResourceQuota %s in %s allows %s of %s; %s is used, and the move's new claims need %s more",
					q.Name, q.Namespace, hard.String(), name, used.String(), want.String())
			}
		}
	}
	return nil
}

// claimQuotaCovers reports whether quota q counts a claim that names no VolumeAttributesClass.
func claimQuotaCovers(q *corev1.ResourceQuota) (bool, error) {
	if len(q.Spec.Scopes) > 0 {
		return false, nil // Terminating, BestEffort, PriorityClass…: pods only
	}
	if q.Spec.ScopeSelector == nil {
		return true, nil
	}
	for _, r := range q.Spec.ScopeSelector.MatchExpressions {
		if r.ScopeName != corev1.ResourceQuotaScopeVolumeAttributesClass {
			return false, nil
		}
		switch r.Operator {
		case corev1.ScopeSelectorOpExists, corev1.ScopeSelectorOpIn:
			return false, nil
		case corev1.ScopeSelectorOpDoesNotExist, corev1.ScopeSelectorOpNotIn:
		default:
			return false, fmt.Errorf("ResourceQuota %s in %s has a scope kip cannot evaluate (%s %s): the move cannot tell whether it admits the new claims", q.Name, q.Namespace, r.ScopeName, r.Operator)
		}
	}
	return true, nil
}
