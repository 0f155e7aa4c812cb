package components

import (
	"kipper.run/kip/internal/cluster"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

func (r *renderer) prometheus() (Component, error) {
	grafana := map[string]any{"enabled": true}
	if r.o.Monitoring.Loki {
		grafana["additionalDataSources"] = []any{map[string]any{
			"name": "Loki", "type": "loki", "access": "proxy", "url": "http://loki.loki.svc:3100",
		}}
	}
	return r.chartComponent("prometheus", "monitoring", map[string]any{
		// Nothing routes alerts yet.
		"alertmanager": map[string]any{"enabled": false},
		"grafana":      grafana,
		// k3s runs these inside its own process, where they cannot be scraped.
		"kubeEtcd":              map[string]any{"enabled": false},
		"kubeControllerManager": map[string]any{"enabled": false},
		"kubeScheduler":         map[string]any{"enabled": false},
		"kubeProxy":             map[string]any{"enabled": false},
		// kube-state-metrics rebuilds its view of every object whenever the API server returns;
		// 64Mi OOM-killed it in that burst.
		"kube-state-metrics": map[string]any{"resources": map[string]any{
			"requests": map[string]any{"cpu": "10m", "memory": "64Mi"},
			"limits":   map[string]any{"memory": "256Mi"},
		}},
		"prometheus": map[string]any{"prometheusSpec": map[string]any{
			"retention":     retention(r.o.Sizing.Profile.PrometheusRetention, func(p cluster.Profile) string { return p.PrometheusRetention }),
			"retentionSize": prometheusMaxTSDB,
			"storageSpec": map[string]any{"volumeClaimTemplate": map[string]any{"spec": map[string]any{
				"storageClassName": localPathClass,
				"accessModes":      []any{"ReadWriteOnce"},
				"resources":        map[string]any{"requests": map[string]any{"storage": prometheusVolumeSize}},
			}}},
			// Scrape the ServiceMonitors of every release, not only this chart's.
			"serviceMonitorSelectorNilUsesHelmValues": false,
			"podMonitorSelectorNilUsesHelmValues":     false,
		}},
	})
}

func (r *renderer) loki() (Component, error) {
	// Loki has its own namespace: Prometheus's operator makes workloads in monitoring that no Helm
	// release marks, which Loki's readiness would otherwise wait for.
	return r.chartComponent("loki", "loki", map[string]any{
		"deploymentMode": "SingleBinary",
		"loki": map[string]any{
			"auth_enabled": false,
			"commonConfig": map[string]any{"replication_factor": 1},
			"storage":      map[string]any{"type": "filesystem"},
			"schemaConfig": map[string]any{"configs": []any{map[string]any{
				"from": "2024-04-01", "store": "tsdb", "object_store": "filesystem", "schema": "v13",
				"index": map[string]any{"prefix": "index_", "period": "24h"},
			}}},
			"limits_config": map[string]any{"retention_period": retention(r.o.Sizing.Profile.LokiRetention, func(p cluster.Profile) string { return p.LokiRetention })},
			"compactor":     map[string]any{"retention_enabled": true, "delete_request_store": "filesystem"},
		},
		"singleBinary": map[string]any{
			"replicas":    1,
			"persistence": map[string]any{"size": lokiVolumeSize, "storageClass": localPathClass},
		},
		"read":         map[string]any{"replicas": 0},
		"write":        map[string]any{"replicas": 0},
		"backend":      map[string]any{"replicas": 0},
		"gateway":      map[string]any{"enabled": false},
		"chunksCache":  map[string]any{"enabled": false},
		"resultsCache": map[string]any{"enabled": false},
		"lokiCanary":   map[string]any{"enabled": false},
		"test":         map[string]any{"enabled": false},
	})
}

// retention is the profile's retention, or, on a profile that keeps no monitoring (nano, where
// it is turned on later), the shortest one a profile keeps.
func retention(v string, of func(cluster.Profile) string) string {
	if v != "" {
		return v
	}
	for _, p := range cluster.Profiles {
		if of(p) != "" {
			return of(p)
		}
	}
	return ""
}
