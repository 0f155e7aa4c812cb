package backup

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/kube"
)

// Lookup resolves a host name to its addresses from this machine (net.Resolver.LookupNetIP).
type Lookup func(ctx context.Context, host string) ([]netip.Addr, error)

// configureOutside is how an operator gives a cluster backups outside it.
const configureOutside = "configure external storage first by running kip install again with --backup-storage-bucket and its related flags " +
	"(read \"Re-running install\" in kip's documentation before you do: a re-run also resets users created in the console)"

// CheckOutside refuses backup storage that would not outlive the cluster's Longhorn storage
// (spec 002, "Longhorn upgrades"): backups off, backups in the in-cluster MinIO (which lives on
// that storage), and an endpoint that leads back into the cluster. The endpoint is Velero's
// backup location's; its name is resolved from this machine by lookup, and each address is
// refused when it is loopback, link-local or unspecified, in the pod or Service network, a
// Node's, a Service's or one of a Service's endpoints. No endpoint is AWS S3, outside.
func CheckOutside(ctx context.Context, cl *kube.Clients, rec cluster.Record, lookup Lookup) error {
	switch rec.Backups {
	case cluster.BackupsNone:
		return fmt.Errorf("the cluster keeps no backups: %s", configureOutside)
	case cluster.BackupsInCluster:
		return fmt.Errorf("the cluster's backups are in the in-cluster MinIO, on the Longhorn storage the upgrade changes: %s", configureOutside)
	}
	bsl, err := kube.GetAs[velerov1.BackupStorageLocation](ctx, cl.Dynamic, bslGVR, components.VeleroNamespace, components.BackupLocation)
	if err != nil {
		return fmt.Errorf("read Velero's backup location %s/%s: %w", components.VeleroNamespace, components.BackupLocation, err)
	}
	endpoint := bsl.Spec.Config["s3Url"]
	if endpoint == "" {
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Hostname() == "" {
		return fmt.Errorf("the backup endpoint %q is not a URL kip can check: %s", endpoint, configureOutside)
	}
	name := u.Hostname()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(name); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = lookup(ctx, name); err != nil || len(addrs) == 0 {
		return fmt.Errorf("the backup endpoint's name %s does not resolve from this machine (%v), so kip cannot check that it is outside the cluster; fix its DNS, or %s", name, err, configureOutside)
	}
	inside, err := clusterAddresses(ctx, cl)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		a = a.Unmap()
		why := inside[a] // the most precise: the node or Service it is
		switch {
		case why != "":
		case a.IsLoopback():
			why = "a loopback address"
		case a.IsUnspecified():
			why = "the unspecified address (this machine, wherever it is used)"
		case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
			why = "a link-local address"
		case host.PodNetwork.Contains(a):
			why = "in the cluster's pod network " + host.PodNetwork.String()
		case host.ServiceNetwork.Contains(a):
			why = "in the cluster's Service network " + host.ServiceNetwork.String()
		}
		if why != "" {
			return fmt.Errorf("the backup endpoint %s leads back into the cluster: %s is %s; backups there do not outlive the storage the upgrade changes: %s", endpoint, a, why, configureOutside)
		}
	}
	return nil
}

// clusterAddresses are the addresses of the cluster's Nodes, Services and Services' endpoints,
// each with what it is.
func clusterAddresses(ctx context.Context, cl *kube.Clients) (map[netip.Addr]string, error) {
	out := map[netip.Addr]string{}
	add := func(s, what string) {
		if a, err := netip.ParseAddr(s); err == nil {
			if _, seen := out[a.Unmap()]; !seen {
				out[a.Unmap()] = what
			}
		}
	}
	nodes, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the cluster's nodes: %w", err)
	}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			add(a.Address, "node "+n.Name+"'s address")
		}
	}
	services, err := cl.Kube.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the cluster's Services: %w", err)
	}
	for _, s := range services.Items {
		what := "the address of Service " + s.Namespace + "/" + s.Name
		for _, ip := range append(append([]string{}, s.Spec.ClusterIPs...), s.Spec.ExternalIPs...) {
			add(ip, what)
		}
		for _, in := range s.Status.LoadBalancer.Ingress {
			add(in.IP, what)
		}
	}
	eps, err := cl.Kube.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the cluster's endpoints: %w", err)
	}
	for _, es := range eps.Items {
		what := "an endpoint of Service " + es.Namespace + "/" + es.Labels[discoveryv1.LabelServiceName]
		for _, e := range es.Endpoints {
			for _, a := range e.Addresses {
				add(a, what)
			}
		}
	}
	return out, nil
}
