package components

import (
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"kipper.run/kip/internal/cluster"
)

// TestRoutesCoverTheCatalogue renders every component kip can install and finds each route
// they make in Routes: every backend of every Ingress kip renders, and every chart whose values
// turn an ingress on (Dex's, whose backend is the chart's Service dex on 5556).
func TestRoutesCoverTheCatalogue(t *testing.T) {
	routes := Routes()
	inCatalogue := func(component, namespace, service, port string) bool {
		return slices.Contains(routes, Route{Component: component, What: whatOf(routes, namespace, service), Namespace: namespace, Service: service, Port: port})
	}
	seen := map[string]bool{}
	external := testOptions(t, "small", cluster.StorageLonghorn)
	external.Backups = &BackupStorage{Bucket: "backups", AccessKeyID: "AKIAEXAMPLE", SecretAccessKey: "wJalrXUtnFEMIEXAMPLEKEY"}
	for _, o := range []Options{testOptions(t, "small", cluster.StorageLonghorn), external} {
		for _, c := range renderComponents(t, o) {
			for _, u := range slices.Concat(c.Objects, c.CreateOnly, c.After) {
				switch u.GetKind() {
				case "Ingress":
					var ing networkingv1.Ingress
					fromUnstr(t, u, &ing)
					for _, rule := range ing.Spec.Rules {
						for _, p := range rule.HTTP.Paths {
							s := p.Backend.Service
							if !inCatalogue(c.Name, ing.Namespace, s.Name, BackendPort(s.Port)) {
								t.Errorf("%s renders Ingress %s/%s with backend %s:%s, which Routes lacks", c.Name, ing.Namespace, ing.Name, s.Name, BackendPort(s.Port))
							}
							seen[c.Name] = true
						}
					}
				case "HelmChart":
					_, values := chartValues(t, c)
					for _, key := range enabledIngresses(values, "") {
						if c.Name != "dex" || key != "ingress" {
							t.Errorf("chart %s: values turn on %s, which Routes does not know", c.Name, key)
							continue
						}
						if !inCatalogue("dex", dexNamespace, "dex", "5556") {
							t.Errorf("Routes lacks Dex's route: %v", routes)
						}
						seen[c.Name] = true
					}
				}
			}
		}
	}
	for _, r := range routes {
		if !seen[r.Component] {
			t.Errorf("Routes has %s's route %s, but no rendered component %s routes anything", r.Component, r.TraefikService(), r.Component)
		}
	}
}

func whatOf(routes []Route, namespace, service string) string {
	for _, r := range routes {
		if r.Namespace == namespace && r.Service == service {
			return r.What
		}
	}
	return ""
}

// enabledIngresses returns the paths of the values' ingresses that are on: maps under a key
// ingress, or ending in Ingress (MinIO's consoleIngress), with enabled: true.
func enabledIngresses(values map[string]any, at string) []string {
	var out []string
	for k, v := range values {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		path := strings.TrimPrefix(at+"."+k, ".")
		if (k == "ingress" || strings.HasSuffix(k, "Ingress")) && m["enabled"] == true {
			out = append(out, path)
		}
		out = append(out, enabledIngresses(m, path)...)
	}
	return out
}

func TestRouteNames(t *testing.T) {
	api := Routes()[0]
	for _, tt := range []struct{ got, want string }{
		// Spec 002's example: app system-console-api in namespace kipper on port 8080.
		{RouteName("kipper", "system-console-api"), "kipper-system-console-api"},
		{api.Name(), "kipper-system-console-api"},
		{TraefikService("kipper", "system-console-api", "8080"), "kipper-system-console-api-8080"},
		{api.TraefikService(), "kipper-system-console-api-8080"},
		{Routes()[2].TraefikService(), "dex-dex-5556"},
		// Runs of other characters become one "-", as Traefik's provider.Normalize makes them.
		{RouteName("shop-prod", "a--b"), "shop-prod-a-b"},
		{BackendPort(networkingv1.ServiceBackendPort{Number: 8080}), "8080"},
		{BackendPort(networkingv1.ServiceBackendPort{Name: "http"}), "http"},
		{TraefikService("kipper", "system-console-api", "http"), "kipper-system-console-api-http"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
