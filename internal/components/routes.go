package components

import (
	"strconv"
	"strings"
	"unicode"

	networkingv1 "k8s.io/api/networking/v1"
)

// Route names (spec 002, "Route names"). Traefik's Kubernetes Ingress provider serves each
// backend of an Ingress as the Traefik service <namespace>-<service>-<port>: the Ingress's
// namespace, the backend's Service and its port, the port's name when the backend names one and
// its number otherwise, with every run of characters other than letters and digits made one "-".
// Source: traefik/traefik, pkg/provider/kubernetes/ingress/kubernetes.go of v3.7 (the
// serviceName built by loadConfigurationFromIngresses, portString, and provider.Normalize in
// pkg/provider/configuration.go); its maintainers describe the same naming in traefik/traefik
// pull request 10758. Traefik v3.8's safeNaming option (a "_" separator) would end this, but the
// Traefik kip pins (v3.7) has no such option. Traefik's request figures (the metrics of
// traefik_service_*) are labelled with that service name, so two backends that get one name share
// one set of figures, and one Traefik service serves both: requests can reach the wrong one.
//
// A route name is the part before the port: <namespace>-<service>, normalized the same way.
// docs/upgrade.md, "Route names", is the operator's view.

// Route is one route kip's catalogue renders: an Ingress backend of one of its components.
type Route struct {
	// Component is the component that renders it (Component.Name): console, dex.
	Component string
	// What names it in a sentence: "the console API", "the console", "Dex".
	What string
	// Namespace and Service are the Ingress's namespace and its backend's Service.
	Namespace, Service string
	// Port is the backend's port as Traefik renders it (BackendPort): its number here, as every
	// backend kip renders gives one.
	Port string
}

// Name is the route's name, <namespace>-<service>.
func (r Route) Name() string { return RouteName(r.Namespace, r.Service) }

// TraefikService is the Traefik service the route becomes, <namespace>-<service>-<port>.
func (r Route) TraefikService() string { return TraefikService(r.Namespace, r.Service, r.Port) }

// Routes are the routes of kip's whole catalogue, whether a cluster runs the component or not:
// the console's Ingress (kipper-system/console: console-api on 8080 for /api and /auth, console
// on 80 for the rest) and Dex's, which the Dex chart renders from the ingress values kip gives it
// (the Service of a release named as its chart, dex, on the chart's service.ports.http.port,
// 5556). No other component routes anything: the charts of Grafana (in kube-prometheus-stack),
// MinIO (its API and console), Zot, Longhorn and Loki make an Ingress only when their values ask,
// and kip's values leave their ingresses off (TestRoutesCoverTheCatalogue). Traefik's dashboard
// is not an Ingress.
func Routes() []Route {
	return []Route{
		{Component: "console", What: "the console API", Namespace: systemNamespace, Service: "console-api", Port: strconv.Itoa(consoleAPIPort)},
		{Component: "console", What: "the console", Namespace: systemNamespace, Service: "console", Port: strconv.Itoa(consolePort)},
		{Component: "dex", What: "Dex", Namespace: dexNamespace, Service: "dex", Port: strconv.Itoa(dexHTTPPort)},
	}
}

// dexHTTPPort is the Dex chart's service.ports.http.port, which its Ingress routes to.
const dexHTTPPort = 5556

// RouteName is the route name of a backend Service in namespace: <namespace>-<service>.
func RouteName(namespace, service string) string { return normalize(namespace + "-" + service) }

// TraefikService is the Traefik service of a backend: <namespace>-<service>-<port>, port as
// BackendPort renders it.
func TraefikService(namespace, service, port string) string {
	return normalize(namespace + "-" + service + "-" + port)
}

// BackendPort renders a backend's port as Traefik does: its name when it names one, else its
// number.
func BackendPort(p networkingv1.ServiceBackendPort) string {
	if p.Name != "" {
		return p.Name
	}
	return strconv.Itoa(int(p.Number))
}

// normalize is Traefik's provider.Normalize: the runs of letters and digits, joined by "-".
func normalize(name string) string {
	return strings.Join(strings.FieldsFunc(name, func(c rune) bool {
		return !unicode.IsLetter(c) && !unicode.IsNumber(c)
	}), "-")
}

// IngressClass is the IngressClass of kip's Traefik, which every Ingress kip renders names.
// Traefik serves an Ingress of no class too; one that names another class, by its
// ingressClassName or its kubernetes.io/ingress.class annotation, is not Traefik's.
const IngressClass = ingressClass
