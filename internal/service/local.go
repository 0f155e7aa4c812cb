package service

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// LocalPath returns the directory of a local-path volume and the node holding it (NodeOf); ""
// when it is not a local volume.
func LocalPath(pv *corev1.PersistentVolume) (path, node string) {
	switch {
	case pv.Spec.HostPath != nil:
		path = pv.Spec.HostPath.Path
	case pv.Spec.Local != nil:
		path = pv.Spec.Local.Path
	default:
		return "", ""
	}
	return strings.TrimSuffix(path, "/"), NodeOf(pv)
}
