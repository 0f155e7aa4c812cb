package capacity

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// ApplyLimitRanges is pod as the API server's LimitRanger admission leaves it, which runs before
// the quota's: each container without a request or limit gets the namespace's defaults for
// containers; then it refuses, naming the LimitRange, a container or the pod outside a range's
// minimum or maximum, a container without a limit a maximum needs, or a limit too many times its
// request. The result is what CheckQuotas must count.
func ApplyLimitRanges(ranges []corev1.LimitRange, pod *corev1.Pod) (*corev1.Pod, error) {
	p := pod.DeepCopy()
	for _, lr := range ranges {
		for _, item := range lr.Spec.Limits {
			if item.Type != corev1.LimitTypeContainer {
				continue
			}
			for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
				for i := range cs {
					defaults(&cs[i].Resources, item)
				}
			}
		}
	}
	for _, lr := range ranges {
		for _, item := range lr.Spec.Limits {
			var err error
			switch item.Type {
			case corev1.LimitTypeContainer:
				for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
					if err = within(item, c.Resources.Requests, c.Resources.Limits, "Container"); err != nil {
						err = fmt.Errorf("container %s: %w", c.Name, err)
						break
					}
				}
			case corev1.LimitTypePod:
				err = within(item, resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}), resourcehelper.PodLimits(p, resourcehelper.PodResourcesOptions{}), "Pod")
			}
			if err != nil {
				return nil, fmt.Errorf("LimitRange %s in %s refuses pod %s: %w", lr.Name, lr.Namespace, pod.Name, err)
			}
		}
	}
	return p, nil
}

// defaults sets a container's missing requests and limits from a LimitRange item: its default
// limits, and its default requests (which the API gives the item's default limits when unset).
func defaults(r *corev1.ResourceRequirements, item corev1.LimitRangeItem) {
	set := func(l *corev1.ResourceList, from corev1.ResourceList) {
		for n, q := range from {
			if _, ok := (*l)[n]; ok {
				continue
			}
			if *l == nil {
				*l = corev1.ResourceList{}
			}
			(*l)[n] = q.DeepCopy()
		}
	}
	set(&r.Limits, item.Default)
	set(&r.Requests, item.DefaultRequest)
}

// within checks requests and limits against one LimitRange item, as LimitRanger does for kind.
func within(item corev1.LimitRangeItem, requests, limits corev1.ResourceList, kind string) error {
	for n, min := range item.Min {
		req, hasReq := requests[n]
		lim, hasLim := limits[n]
		switch {
		case !hasReq:
			return fmt.Errorf("minimum %s usage per %s is %s: no request is set", n, kind, min.String())
		case req.Cmp(min) < 0:
			return fmt.Errorf("minimum %s usage per %s is %s, but request is %s", n, kind, min.String(), req.String())
		case hasLim && lim.Cmp(min) < 0:
			return fmt.Errorf("minimum %s usage per %s is %s, but limit is %s", n, kind, min.String(), lim.String())
		}
	}
	for n, max := range item.Max {
		req, hasReq := requests[n]
		lim, hasLim := limits[n]
		switch {
		case !hasLim:
			return fmt.Errorf("maximum %s usage per %s is %s: no limit is set", n, kind, max.String())
		case lim.Cmp(max) > 0:
			return fmt.Errorf("maximum %s usage per %s is %s, but limit is %s", n, kind, max.String(), lim.String())
		case hasReq && req.Cmp(max) > 0:
			return fmt.Errorf("maximum %s usage per %s is %s, but request is %s", n, kind, max.String(), req.String())
		}
	}
	for n, ratio := range item.MaxLimitRequestRatio {
		req, hasReq := requests[n]
		lim, hasLim := limits[n]
		if !hasLim {
			return fmt.Errorf("%s max limit to request ratio per %s is %s: no limit is set", n, kind, ratio.String())
		}
		if !hasReq || req.IsZero() {
			return fmt.Errorf("%s max limit to request ratio per %s is %s: no request is set", n, kind, ratio.String())
		}
		// limit/request > ratio, in milli-units to keep fractions
		if lim.MilliValue()*1000 > req.MilliValue()*ratio.MilliValue() {
			return fmt.Errorf("%s max limit to request ratio per %s is %s, but %s/%s is more", n, kind, ratio.String(), lim.String(), req.String())
		}
	}
	return nil
}
