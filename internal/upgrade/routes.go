package upgrade

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// The route names of spec 002 ("Route names"): Traefik serves each Ingress backend as the service
// <namespace>-<service>-<port> and labels its request figures with that name
// (components.TraefikService says where that rule comes from), so an app's route can take the
// name of a Kipper component's. The check finds three things:
//
//   - RouteConflict: an app's or a service's route makes the very Traefik service of a Kipper
//     component the cluster runs (same route name, same port): one Traefik service serves both.
//     It fails the check. kip upgrade removes those routes that Kipper manages, on consent.
//   - RouteReserved: a route takes the route name of a component of kip's catalogue that the
//     cluster does not run, or runs on another port. Advisory.
//   - RouteBetween: routes of two or more apps or services have one route name. Advisory.
//
// docs/console.md ("Routes") says how kip tells an app's or a service's route, and which routes
// Kipper manages; docs/upgrade.md ("Route names") is the operator's view.

// Which routes Kipper manages: console-api labels each Ingress it makes for an app or a service.
const (
	RouteManagedByLabel = "app.kubernetes.io/managed-by"
	RouteManagedBy      = "kipper-console-api"
)

// RouteOwner is what a route reaches: an app or a service.
type RouteOwner string

const (
	RouteOfApp     RouteOwner = "app"
	RouteOfService RouteOwner = "service"
)

// IngressRef is one Ingress as the check read it. It is what kip upgrade records to remove a
// route (RemoveRoute, RouteRemoved): the UID makes sure it removes the very Ingress the operator
// consented to remove, not another made since under the same name.
type IngressRef struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
}

func (r IngressRef) String() string { return r.Namespace + "/" + r.Name }

// Route is one route of an app or a service: a backend of an Ingress whose Service is the app's or
// the service's (console-api exposes app or service X as the Service X of its namespace).
type Route struct {
	Owner RouteOwner
	// Namespace and Name are the app's or the service's.
	Namespace, Name string
	// Port is the backend's port as Traefik names it (components.BackendPort).
	Port string
	// Ingress holds the route; Managed says that Kipper manages it (RouteManagedByLabel).
	Ingress IngressRef
	Managed bool
}

// String names the route as the check prints it: "app api in namespace shop-prod on port 80".
func (r Route) String() string {
	return fmt.Sprintf("%s %s in namespace %s on port %s", r.Owner, r.Name, r.Namespace, r.Port)
}

// RouteName is the route's name, <namespace>-<name>.
func (r Route) RouteName() string { return components.RouteName(r.Namespace, r.Name) }

// TraefikService is the Traefik service the route becomes, <namespace>-<name>-<port>.
func (r Route) TraefikService() string {
	return components.TraefikService(r.Namespace, r.Name, r.Port)
}

func (r Route) owner() string { return string(r.Owner) + " " + r.Namespace + "/" + r.Name }

// ReadRoutes reads the routes of the cluster's apps and services, and the routes of kip's
// catalogue the cluster runs (installed, each with the port the cluster routes it on), in three
// API requests whatever the cluster's size: every Ingress, every App and every Kipper Service,
// each listed once. A cluster without Kipper's App or Service CRD has none of those.
//
// Only Ingresses Traefik serves count: one whose class (ingressClassName, or the
// kubernetes.io/ingress.class annotation) names another class than kip's is left out. So are
// backends of no Service, and an Ingress's default backend, which Traefik serves as its one
// default-backend service, not by name. A backend in the namespace of a catalogue route, to its
// Service, is that component's route whatever its port.
func ReadRoutes(ctx context.Context, cl *kube.Clients) (routes []Route, installed []components.Route, err error) {
	ingresses, err := cl.Kube.NetworkingV1().Ingresses("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list the Ingresses: %w", err)
	}
	owners := map[string]RouteOwner{}
	for _, of := range []struct {
		owner RouteOwner
		gvr   schema.GroupVersionResource
	}{{RouteOfApp, app.AppsGVR}, {RouteOfService, service.ServicesGVR}} {
		names, err := listNames(ctx, cl, of.gvr)
		if err != nil {
			return nil, nil, err
		}
		for _, n := range names {
			if _, ok := owners[n]; !ok { // an app and a service of one name: the app's
				owners[n] = of.owner
			}
		}
	}
	catalogue := components.Routes()
	seen := map[string]bool{}
	for i := range ingresses.Items {
		ing := &ingresses.Items[i]
		if !servedByTraefik(ing) {
			continue
		}
		ref := IngressRef{Namespace: ing.Namespace, Name: ing.Name, UID: ing.UID}
		managed := ing.Labels[RouteManagedByLabel] == RouteManagedBy
		for _, rule := range ing.Spec.Rules {
			if rule.HTTP == nil {
				continue
			}
			for _, p := range rule.HTTP.Paths {
				b := p.Backend.Service
				if b == nil {
					continue
				}
				port := components.BackendPort(b.Port)
				if c, ok := catalogued(catalogue, ing.Namespace, b.Name); ok {
					c.Port = port
					if key := "component " + c.TraefikService(); !seen[key] {
						seen[key] = true
						installed = append(installed, c)
					}
					continue
				}
				owner, ok := owners[ing.Namespace+"/"+b.Name]
				if !ok {
					continue
				}
				r := Route{Owner: owner, Namespace: ing.Namespace, Name: b.Name, Port: port, Ingress: ref, Managed: managed}
				if key := r.owner() + " " + port + " " + string(ref.UID); !seen[key] {
					seen[key] = true
					routes = append(routes, r)
				}
			}
		}
	}
	sort.Slice(routes, func(i, j int) bool { return routeLess(routes[i], routes[j]) })
	return routes, installed, nil
}

// listNames lists the objects of gvr in every namespace, as namespace/name; none when the
// cluster does not serve the resource (no Kipper CRDs).
func listNames(ctx context.Context, cl *kube.Clients, gvr schema.GroupVersionResource) ([]string, error) {
	list, err := cl.Dynamic.Resource(gvr).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the %s: %w", gvr.Resource, err)
	}
	names := make([]string, 0, len(list.Items))
	for i := range list.Items {
		names = append(names, list.Items[i].GetNamespace()+"/"+list.Items[i].GetName())
	}
	return names, nil
}

func servedByTraefik(ing *networkingv1.Ingress) bool {
	class := ing.Annotations["kubernetes.io/ingress.class"]
	if ing.Spec.IngressClassName != nil {
		class = *ing.Spec.IngressClassName
	}
	return class == "" || class == components.IngressClass
}

func catalogued(catalogue []components.Route, namespace, service string) (components.Route, bool) {
	for _, c := range catalogue {
		if c.Namespace == namespace && c.Service == service {
			return c, true
		}
	}
	return components.Route{}, false
}

func routeLess(a, b Route) bool {
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	if a.Name != b.Name {
		return a.Name < b.Name
	}
	if a.Owner != b.Owner {
		return a.Owner < b.Owner
	}
	if a.Port != b.Port {
		return a.Port < b.Port
	}
	return a.Ingress.String() < b.Ingress.String()
}

// RouteFindingKind is what the route check found.
type RouteFindingKind int

const (
	// RouteConflict: a route makes the Traefik service of an installed component. It fails the
	// check; kip upgrade removes the route when Kipper manages it, on consent.
	RouteConflict RouteFindingKind = iota + 1
	// RouteReserved: a route has the name of a catalogue route the cluster does not run, or runs
	// on another port. Advisory.
	RouteReserved
	// RouteBetween: two or more apps or services have one route name. Advisory.
	RouteBetween
)

// RouteFinding is one finding of the route check.
type RouteFinding struct {
	Kind RouteFindingKind
	// Routes are the routes found: the one route of a RouteConflict or a RouteReserved, and for
	// RouteBetween one route of each app or service and port that shares the name.
	Routes []Route
	// Component is the component's route: as the cluster runs it for RouteConflict, as kip's
	// catalogue has it for RouteReserved; zero for RouteBetween.
	Component components.Route
	// Why says what the check found, after "- "; Advice, one line each, what to do or what kip
	// upgrade does.
	Why    string
	Advice []string
	// Remove: a RouteConflict whose route Kipper manages, which kip upgrade removes on consent
	// (RemoveRoute of Routes[0].Ingress).
	Remove bool
}

// RouteCheck is the route check's verdict, each kind in the routes' order.
type RouteCheck struct {
	Conflicts, Reserved, Between []*RouteFinding
}

// Fails says that the check fails: a route conflicts with an installed component.
func (c RouteCheck) Fails() bool { return len(c.Conflicts) > 0 }

// Removals are the Ingresses kip upgrade removes on consent: those of the conflicts Kipper
// manages, each once.
func (c RouteCheck) Removals() []IngressRef {
	var out []IngressRef
	seen := map[types.UID]bool{}
	for _, f := range c.Conflicts {
		if ref := f.Routes[0].Ingress; f.Remove && !seen[ref.UID] {
			seen[ref.UID] = true
			out = append(out, ref)
		}
	}
	return out
}

// CheckRoutes judges the routes of the apps and services against kip's catalogue
// (components.Routes) and the catalogue routes the cluster runs (installed), and against each
// other; routes and installed are what ReadRoutes returns.
func CheckRoutes(routes []Route, installed []components.Route) RouteCheck {
	var c RouteCheck
	running := map[string]components.Route{} // by Traefik service
	ports := map[string][]string{}           // the ports the cluster routes a catalogue name on
	for _, r := range installed {
		running[r.TraefikService()] = r
		if !slices.Contains(ports[r.Name()], r.Port) {
			ports[r.Name()] = append(ports[r.Name()], r.Port)
		}
	}
	reserved := map[string]components.Route{}
	for _, r := range components.Routes() {
		reserved[r.Name()] = r
	}
	judged := map[string]bool{}
	for _, r := range routes {
		if comp, ok := running[r.TraefikService()]; ok {
			f := &RouteFinding{Kind: RouteConflict, Routes: []Route{r}, Component: comp, Remove: r.Managed,
				Why: fmt.Sprintf("%s conflicts with %s.", r, comp.What)}
			if r.Managed {
				f.Advice = []string{fmt.Sprintf("kip upgrade removes its route, the Ingress %s, which Kipper manages. Use a different %s name to keep the %s reachable.", r.Ingress, r.Owner, r.Owner)}
			} else {
				f.Advice = []string{fmt.Sprintf("Kipper does not manage its route, the Ingress %s: remove it manually.", r.Ingress)}
			}
			c.Conflicts = append(c.Conflicts, f)
			continue
		}
		comp, ok := reserved[r.RouteName()]
		key := r.owner() + " " + r.Port
		if !ok || judged[key] {
			continue
		}
		judged[key] = true
		which := "which is not installed"
		if p := ports[comp.Name()]; len(p) > 0 {
			which = "which uses port " + routeAnd(p)
			if len(p) > 1 {
				which = "which uses ports " + routeAnd(p)
			}
		}
		c.Reserved = append(c.Reserved, &RouteFinding{Kind: RouteReserved, Routes: []Route{r}, Component: comp,
			Why: fmt.Sprintf("%s uses the route name %s, reserved for %s, %s.", r, comp.Name(), comp.What, which)})
	}
	c.Between = between(routes)
	return c
}

// between finds the apps and services whose routes share a route name, or make one Traefik
// service under different route names (a port name can hold a "-": app api on port v2-http and
// app api-v2 on port http of one namespace are both <namespace>-api-v2-http).
func between(routes []Route) []*RouteFinding {
	var rs []Route // one per app or service and port
	seen := map[string]bool{}
	for _, r := range routes {
		if key := r.owner() + " " + r.Port; !seen[key] {
			seen[key] = true
			rs = append(rs, r)
		}
	}
	parent := make([]int, len(rs))
	for i := range parent {
		parent[i] = i
	}
	var root func(int) int
	root = func(i int) int {
		if parent[i] != i {
			parent[i] = root(parent[i])
		}
		return parent[i]
	}
	first := map[string]int{}
	for i, r := range rs {
		for _, key := range []string{"name " + r.RouteName(), "service " + r.TraefikService()} {
			if j, ok := first[key]; ok {
				parent[root(i)] = root(j)
			} else {
				first[key] = i
			}
		}
	}
	groups := map[int][]Route{}
	var order []int
	for i, r := range rs {
		g := root(i)
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], r)
	}
	var out []*RouteFinding
	for _, g := range order {
		group := groups[g]
		sort.Slice(group, func(i, j int) bool { return routeLess(group[i], group[j]) })
		var owners, names, members []string
		byService := map[string][]string{} // Traefik service → its owners
		byNamespace := map[string][]string{}
		for _, r := range group {
			if !slices.Contains(owners, r.owner()) {
				owners = append(owners, r.owner())
				if !slices.Contains(byNamespace[r.Namespace], r.owner()) {
					byNamespace[r.Namespace] = append(byNamespace[r.Namespace], r.owner())
				}
			}
			if !slices.Contains(names, r.RouteName()) {
				names = append(names, r.RouteName())
			}
			if !slices.Contains(byService[r.TraefikService()], r.owner()) {
				byService[r.TraefikService()] = append(byService[r.TraefikService()], r.owner())
			}
			members = append(members, r.String())
		}
		if len(owners) < 2 {
			continue
		}
		var shared, sharedPorts, namespaces []string
		for _, r := range group {
			if s := r.TraefikService(); len(byService[s]) > 1 && !slices.Contains(shared, s) {
				shared = append(shared, s)
				sharedPorts = append(sharedPorts, r.Port)
			}
			if len(byNamespace[r.Namespace]) > 1 && !slices.Contains(namespaces, r.Namespace) {
				namespaces = append(namespaces, r.Namespace)
			}
		}
		f := &RouteFinding{Kind: RouteBetween, Routes: group}
		if len(names) == 1 {
			f.Why = fmt.Sprintf("%s share the route name %s.", routeAnd(members), names[0])
		} else {
			f.Why = fmt.Sprintf("%s share Traefik's service %s.", routeAnd(members), routeAnd(shared))
		}
		switch {
		case len(shared) == 1 && len(byService[shared[0]]) == len(owners) && len(group) == len(owners):
			f.Advice = append(f.Advice, "Their ports match, so requests can reach the wrong app or service.")
		case len(shared) > 0:
			f.Advice = append(f.Advice, fmt.Sprintf("Where their ports match (%s), requests can reach the wrong app or service.", routePorts(sharedPorts)))
		}
		switch {
		case len(namespaces) == 1 && len(byNamespace[namespaces[0]]) == len(owners):
			f.Advice = append(f.Advice, "They are in the same namespace, so a removed route cannot be recreated while the conflicting app or service remains.")
		case len(namespaces) > 0:
			f.Advice = append(f.Advice, fmt.Sprintf("In the same namespace (%s), a removed route cannot be recreated while the conflicting app or service remains.", routeAnd(namespaces)))
		}
		out = append(out, f)
	}
	return out
}

// Write prints the verdict as spec 002's check shows its findings: ✗ for what fails the check,
// ! for what is advisory.
func (c RouteCheck) Write(w io.Writer) {
	group := func(mark string, head []string, fs []*RouteFinding, foot []string) {
		if len(fs) == 0 {
			return
		}
		fmt.Fprintf(w, "  %s   %s\n", mark, strings.Join(head, "\n      "))
		for _, f := range fs {
			fmt.Fprintf(w, "      - %s\n", f.Why)
			for _, a := range f.Advice {
				fmt.Fprintf(w, "          %s\n", a)
			}
		}
		for _, l := range foot {
			fmt.Fprintf(w, "      %s\n", l)
		}
	}
	var confirm []string
	if len(c.Removals()) > 0 {
		confirm = []string{"kip upgrade requires confirmation before it removes the routes Kipper manages. Use --yes to confirm without a prompt."}
	}
	group("✗", []string{"These routes conflict with an installed Kipper component on the same port:"}, c.Conflicts, confirm)
	group("!", []string{"These routes use a name reserved for a Kipper component that is absent or uses a different port.",
		"The existing routes stay available, but their request figures are unavailable:"}, c.Reserved,
		[]string{"kip refuses to install a component while its route name is in use by another namespace, regardless of port.",
			"Rename or remove the conflicting route before installing it."})
	group("!", []string{"These apps and services have conflicting route names. The upgrade keeps their existing routes:"}, c.Between,
		[]string{"Give each a distinct name."})
}

// RemoveRoute removes the Ingress of a route that conflicts with an installed component and that
// Kipper manages (RouteCheck.Removals), if it is still the one the check read: the deletion has
// its UID for precondition. An Ingress already gone is done; so is one whose name another
// Ingress has taken since (the precondition fails), which is left alone for the next check to
// judge.
func RemoveRoute(ctx context.Context, cl *kube.Clients, ref IngressRef) error {
	uid := ref.UID
	err := cl.Kube.NetworkingV1().Ingresses(ref.Namespace).Delete(ctx, ref.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid}})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("remove the route %s: %w", ref, err)
}

// RouteRemoved says whether the Ingress ref is gone: none of its name, or another one (another
// UID) in its place. It is RemoveRoute's check in a workflow step.
func RouteRemoved(ctx context.Context, cl *kube.Clients, ref IngressRef) (bool, error) {
	ing, err := cl.Kube.NetworkingV1().Ingresses(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the route %s: %w", ref, err)
	}
	return ing.UID != ref.UID, nil
}

// routeAnd joins "a", "a and b", "a, b and c".
func routeAnd(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func routePorts(ports []string) string {
	if len(ports) == 1 {
		return "port " + ports[0]
	}
	return "ports " + routeAnd(ports)
}
