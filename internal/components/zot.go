package components

import (
	"encoding/json"
	"fmt"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

func (r *renderer) zot() (Component, error) {
	config := map[string]any{
		"storage": map[string]any{"rootDirectory": "/var/lib/registry", "gc": true, "dedupe": true},
		"http":    map[string]any{"address": "0.0.0.0", "port": "5000"},
		"log":     map[string]any{"level": "info"},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return Component{}, fmt.Errorf("zot config: %w", err)
	}
	return r.chartComponent("zot", "zot", map[string]any{
		"persistence": true,
		"pvc": map[string]any{
			"create":           true,
			"storage":          r.o.Sizing.Profile.RegistrySize,
			"storageClassName": localPathClass,
		},
		"mountConfig": true,
		"configFiles": map[string]any{"config.json": string(configJSON)},
		"service":     map[string]any{"type": "NodePort", "nodePort": RegistryNodePort},
	})
}
