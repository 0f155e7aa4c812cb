package upgrade

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/components"
)

// route is the route of owner ns/name on port, held by the Ingress ns/name (UID ns/name/port),
// which Kipper manages when managed.
func route(owner RouteOwner, ns, name, port string, managed bool) Route {
	return Route{Owner: owner, Namespace: ns, Name: name, Port: port, Managed: managed,
		Ingress: IngressRef{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name + "/" + port)}}
}

// catalogue returns kip's catalogue route of service in namespace, on port when port is not "".
func catalogue(t *testing.T, namespace, service, port string) components.Route {
	t.Helper()
	for _, r := range components.Routes() {
		if r.Namespace == namespace && r.Service == service {
			if port != "" {
				r.Port = port
			}
			return r
		}
	}
	t.Fatalf("no catalogue route %s/%s", namespace, service)
	return components.Route{}
}

// finding is one finding as the test expects it: its kind, its text and what kip upgrade
// removes.
type finding struct {
	kind   RouteFindingKind
	why    string
	advice []string
	remove bool
}

func TestCheckRoutes(t *testing.T) {
	consoleAPI := catalogue(t, "kipper-system", "console-api", "")
	console := catalogue(t, "kipper-system", "console", "")
	dex := catalogue(t, "dex", "dex", "")
	full := []components.Route{consoleAPI, console, dex}
	const removed = "kip upgrade removes its route, the Ingress kipper/system-console-api, which Kipper manages. Use a different app name to keep the app reachable."
	for _, tt := range []struct {
		name      string
		routes    []Route
		installed []components.Route
		want      []finding
	}{
		{
			name:      "spec 002's example: a route Kipper manages on the console API's port",
			routes:    []Route{route(RouteOfApp, "kipper", "system-console-api", "8080", true)},
			installed: full,
			want: []finding{{RouteConflict, "app system-console-api in namespace kipper on port 8080 conflicts with the console API.",
				[]string{removed}, true}},
		},
		{
			name:      "the same route made by hand",
			routes:    []Route{route(RouteOfApp, "kipper", "system-console-api", "8080", false)},
			installed: full,
			want: []finding{{RouteConflict, "app system-console-api in namespace kipper on port 8080 conflicts with the console API.",
				[]string{"Kipper does not manage its route, the Ingress kipper/system-console-api: remove it manually."}, false}},
		},
		{
			name:      "a service's route Kipper manages",
			routes:    []Route{route(RouteOfService, "kipper-system", "console", "80", true)},
			installed: []components.Route{catalogue(t, "kipper-system", "console", "")},
			want: []finding{{RouteConflict, "service console in namespace kipper-system on port 80 conflicts with the console.",
				[]string{"kip upgrade removes its route, the Ingress kipper-system/console, which Kipper manages. Use a different service name to keep the service reachable."}, true}},
		},
		{
			// A port name with a "-" makes the console API's Traefik service from another route name.
			name:      "another route name, one Traefik service",
			routes:    []Route{route(RouteOfApp, "kipper", "system-console", "api-8080", true)},
			installed: full,
			want: []finding{{RouteConflict, "app system-console in namespace kipper on port api-8080 conflicts with the console API.",
				[]string{"kip upgrade removes its route, the Ingress kipper/system-console, which Kipper manages. Use a different app name to keep the app reachable."}, true}},
		},
		{
			name:      "the same name on a named port: another Traefik service, a reserved name",
			routes:    []Route{route(RouteOfApp, "kipper", "system-console-api", "http", true)},
			installed: full,
			want:      []finding{{kind: RouteReserved, why: "app system-console-api in namespace kipper on port http uses the route name kipper-system-console-api, reserved for the console API, which uses port 8080."}},
		},
		{
			name:      "the same name on another port number",
			routes:    []Route{route(RouteOfApp, "kipper", "system-console-api", "9000", false)},
			installed: full,
			want:      []finding{{kind: RouteReserved, why: "app system-console-api in namespace kipper on port 9000 uses the route name kipper-system-console-api, reserved for the console API, which uses port 8080."}},
		},
		{
			name:      "a component the cluster routes on two ports",
			routes:    []Route{route(RouteOfApp, "kipper", "system-console-api", "9000", false)},
			installed: []components.Route{consoleAPI, catalogue(t, "kipper-system", "console-api", "8081")},
			want:      []finding{{kind: RouteReserved, why: "app system-console-api in namespace kipper on port 9000 uses the route name kipper-system-console-api, reserved for the console API, which uses ports 8080 and 8081."}},
		},
		{
			name:   "the console absent: its port taken is no conflict",
			routes: []Route{route(RouteOfApp, "kipper", "system-console-api", "8080", true), route(RouteOfApp, "kipper", "system-console", "80", true)},
			want: []finding{
				{kind: RouteReserved, why: "app system-console-api in namespace kipper on port 8080 uses the route name kipper-system-console-api, reserved for the console API, which is not installed."},
				{kind: RouteReserved, why: "app system-console in namespace kipper on port 80 uses the route name kipper-system-console, reserved for the console, which is not installed."},
			},
		},
		{
			name: "one reserved name for an app held by two Ingresses",
			routes: []Route{route(RouteOfApp, "kipper", "system-console-api", "9000", true),
				{Owner: RouteOfApp, Namespace: "kipper", Name: "system-console-api", Port: "9000", Ingress: IngressRef{Namespace: "kipper", Name: "by-hand", UID: "by-hand"}}},
			installed: full,
			want:      []finding{{kind: RouteReserved, why: "app system-console-api in namespace kipper on port 9000 uses the route name kipper-system-console-api, reserved for the console API, which uses port 8080."}},
		},
		{
			name:      "names of no component",
			routes:    []Route{route(RouteOfApp, "shop-prod", "api", "8080", true), route(RouteOfApp, "kipper", "console-api", "8080", true), route(RouteOfService, "shop-prod", "dex", "5556", false)},
			installed: full,
		},
		{
			name:   "two apps, one route name, one port",
			routes: []Route{route(RouteOfApp, "shop-prod", "api", "80", true), route(RouteOfApp, "shop", "prod-api", "80", true)},
			want: []finding{{kind: RouteBetween, why: "app prod-api in namespace shop on port 80 and app api in namespace shop-prod on port 80 share the route name shop-prod-api.",
				advice: []string{"Their ports match, so requests can reach the wrong app or service."}}},
		},
		{
			name:   "an app and a service, one route name, other ports",
			routes: []Route{route(RouteOfApp, "shop-prod", "db-x", "80", true), route(RouteOfService, "shop-prod-db", "x", "5432", true)},
			want:   []finding{{kind: RouteBetween, why: "app db-x in namespace shop-prod on port 80 and service x in namespace shop-prod-db on port 5432 share the route name shop-prod-db-x."}},
		},
		{
			name:   "one route name in one namespace",
			routes: []Route{route(RouteOfApp, "shop-prod", "a--b", "80", true), route(RouteOfApp, "shop-prod", "a-b", "80", false)},
			want: []finding{{kind: RouteBetween, why: "app a--b in namespace shop-prod on port 80 and app a-b in namespace shop-prod on port 80 share the route name shop-prod-a-b.",
				advice: []string{"Their ports match, so requests can reach the wrong app or service.",
					"They are in the same namespace, so a removed route cannot be recreated while the conflicting app or service remains."}}},
		},
		{
			name:   "two route names, one Traefik service",
			routes: []Route{route(RouteOfApp, "shop-prod", "api", "v2-http", true), route(RouteOfApp, "shop-prod", "api-v2", "http", true)},
			want: []finding{{kind: RouteBetween, why: "app api in namespace shop-prod on port v2-http and app api-v2 in namespace shop-prod on port http share Traefik's service shop-prod-api-v2-http.",
				advice: []string{"Their ports match, so requests can reach the wrong app or service.",
					"They are in the same namespace, so a removed route cannot be recreated while the conflicting app or service remains."}}},
		},
		{
			name: "two apps on several ports, one matching, and an app of another name",
			routes: []Route{route(RouteOfApp, "a-b", "c", "80", true), route(RouteOfApp, "a", "b-c", "80", true), route(RouteOfApp, "a", "b-c", "8080", true),
				route(RouteOfApp, "a-b-c", "x", "80", true), route(RouteOfApp, "a-b", "c", "9000", true)},
			want: []finding{{kind: RouteBetween, why: "app b-c in namespace a on port 80, app b-c in namespace a on port 8080, app c in namespace a-b on port 80 and app c in namespace a-b on port 9000 share the route name a-b-c.",
				advice: []string{"Where their ports match (port 80), requests can reach the wrong app or service."}}},
		},
		{
			name:   "one app, two Ingresses, one made by hand",
			routes: []Route{route(RouteOfApp, "shop-prod", "api", "80", true), {Owner: RouteOfApp, Namespace: "shop-prod", Name: "api", Port: "80", Ingress: IngressRef{Namespace: "shop-prod", Name: "api-by-hand", UID: "x"}}},
		},
		{
			name:   "one app on two ports",
			routes: []Route{route(RouteOfApp, "shop-prod", "api", "80", true), route(RouteOfApp, "shop-prod", "api", "8080", true)},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := CheckRoutes(tt.routes, tt.installed)
			var got []finding
			for _, fs := range [][]*RouteFinding{c.Conflicts, c.Reserved, c.Between} {
				for _, f := range fs {
					got = append(got, finding{f.Kind, f.Why, f.Advice, f.Remove})
				}
			}
			if !slices.EqualFunc(got, tt.want, func(a, b finding) bool {
				return a.kind == b.kind && a.why == b.why && slices.Equal(a.advice, b.advice) && a.remove == b.remove
			}) {
				t.Errorf("findings\n got %+v\nwant %+v", got, tt.want)
			}
			if fails := len(c.Conflicts) > 0; c.Fails() != fails {
				t.Errorf("Fails() = %v with %d conflicts", c.Fails(), len(c.Conflicts))
			}
		})
	}
}

// TestRouteCheckWrite prints every kind of finding as kip upgrade --check shows them.
func TestRouteCheckWrite(t *testing.T) {
	installed := []components.Route{catalogue(t, "kipper-system", "console-api", "")}
	managed := route(RouteOfApp, "kipper", "system-console-api", "8080", true)
	byHand := Route{Owner: RouteOfApp, Namespace: "kipper", Name: "system-console-api", Port: "8080",
		Ingress: IngressRef{Namespace: "kipper", Name: "console-api-by-hand", UID: "by-hand"}}
	routes := []Route{managed, byHand,
		route(RouteOfApp, "kipper", "system-console", "80", true),
		route(RouteOfApp, "shop-prod", "api", "80", true), route(RouteOfService, "shop", "prod-api", "80", true)}
	c := CheckRoutes(routes, installed)
	var out bytes.Buffer
	c.Write(&out)
	want := `  ✗   These routes conflict with an installed Kipper component on the same port:
      - app system-console-api in namespace kipper on port 8080 conflicts with the console API.
          kip upgrade removes its route, the Ingress kipper/system-console-api, which Kipper manages. Use a different app name to keep the app reachable.
      - app system-console-api in namespace kipper on port 8080 conflicts with the console API.
          Kipper does not manage its route, the Ingress kipper/console-api-by-hand: remove it manually.
      kip upgrade requires confirmation before it removes the routes Kipper manages. Use --yes to confirm without a prompt.
  !   These routes use a name reserved for a Kipper component that is absent or uses a different port.
      The existing routes stay available, but their request figures are unavailable:
      - app system-console in namespace kipper on port 80 uses the route name kipper-system-console, reserved for the console, which is not installed.
      kip refuses to install a component while its route name is in use by another namespace, regardless of port.
      Rename or remove the conflicting route before installing it.
  !   These apps and services have conflicting route names. The upgrade keeps their existing routes:
      - service prod-api in namespace shop on port 80 and app api in namespace shop-prod on port 80 share the route name shop-prod-api.
          Their ports match, so requests can reach the wrong app or service.
      Give each a distinct name.
`
	if out.String() != want {
		t.Errorf("the check printed\n%s\nwant\n%s", out.String(), want)
	}
	if !c.Fails() {
		t.Error("a conflict does not fail the check")
	}
	if got := c.Removals(); !slices.Equal(got, []IngressRef{managed.Ingress}) {
		t.Errorf("kip upgrade removes %v, want only the route Kipper manages, %v", got, managed.Ingress)
	}

	// Without a route Kipper manages, nothing asks for confirmation; without findings, nothing
	// is printed.
	out.Reset()
	CheckRoutes([]Route{byHand}, installed).Write(&out)
	if strings.Contains(out.String(), "confirmation") || !strings.Contains(out.String(), "remove it manually") {
		t.Errorf("a conflict made by hand printed\n%s", out.String())
	}
	out.Reset()
	if c := CheckRoutes([]Route{route(RouteOfApp, "shop-prod", "api", "80", true)}, installed); c.Fails() || len(c.Removals()) > 0 {
		t.Errorf("a route of its own fails the check: %+v", c)
	} else if c.Write(&out); out.Len() > 0 {
		t.Errorf("no findings printed\n%s", out.String())
	}
}
