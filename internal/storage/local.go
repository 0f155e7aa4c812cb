package storage

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// LocalPath returns the directory of a local-path volume and the node holding it ("" when it
// is not a local volume).
func LocalPath(pv *corev1.PersistentVolume) (path, node string) {
	switch {
	case pv.Spec.HostPath != nil:
		path = pv.Spec.HostPath.Path
	case pv.Spec.Local != nil:
		path = pv.Spec.Local.Path
	default:
		return "", ""
	}
	if a := pv.Spec.NodeAffinity; a != nil && a.Required != nil {
		for _, term := range a.Required.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				if e.Key == corev1.LabelHostname && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
					node = e.Values[0]
				}
			}
		}
	}
	return strings.TrimSuffix(path, "/"), node
}
