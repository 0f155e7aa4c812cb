package backup_test

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	velerotest "kipper.run/kip/test/velero"
)

// TestCheckOutside: spec 002's backup storage for a Longhorn upgrade, against the API server
// and the backup location the real Velero of these tests uses (its S3 on loopback). Refused:
// backups off or in the in-cluster MinIO; an endpoint on loopback, link-local, in the pod or
// Service network, at a Node's address, a Service's address or one of its endpoints, or whose
// name does not resolve. Allowed: AWS (no endpoint), and a name that resolves outside.
func TestCheckOutside(t *testing.T) {
	f := newFixture(t, "small", cluster.BackupsExternal)
	ctx := context.Background()
	ns := f.env.Namespace(t)
	rec := cluster.Record{Backups: cluster.BackupsExternal}
	names := map[string][]netip.Addr{
		"backups.example":    {netip.MustParseAddr("198.51.100.200")},
		"link-local.example": {netip.MustParseAddr("169.254.10.1")},
		"mapped.example":     {netip.MustParseAddr("::ffff:10.42.3.4")},
	}
	lookup := func(_ context.Context, host string) ([]netip.Addr, error) {
		if a, ok := names[host]; ok {
			return a, nil
		}
		return nil, errors.New("no such host")
	}
	setEndpoint := func(url string) {
		t.Helper()
		patch := `{"spec":{"config":{"s3Url":` + strconv.Quote(url) + `}}}`
		if url == "" {
			patch = `{"spec":{"config":{"s3Url":null}}}`
		}
		if _, err := f.cl.Dynamic.Resource(velerotest.LocationResource).Namespace(components.VeleroNamespace).Patch(ctx, components.BackupLocation, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// A Node with an address, as a kubelet reports it.
	node, err := f.cl.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "addressed-" + ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cl.Kube.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	const nodeIP = "203.0.113.77"
	// A merge patch: the node lifecycle controller changes the Node meanwhile.
	patch := `{"status":{"addresses":[{"type":"InternalIP","address":"` + nodeIP + `"}]}}`
	if _, err := f.cl.Kube.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	svc, err := f.cl.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "store", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 9000}}, ExternalIPs: []string{"192.0.2.50"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "store-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "store"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.60"}}},
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](9000)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, backups, endpoint, want string
	}{
		{"backups off", cluster.BackupsNone, "", "the cluster keeps no backups: configure external storage first by running kip install again with --backup-storage-bucket"},
		{"in-cluster MinIO", cluster.BackupsInCluster, "", "in the in-cluster MinIO, on the Longhorn storage the upgrade changes"},
		{"the test's S3 on loopback", cluster.BackupsExternal, "as started", "is a loopback address"},
		{"link-local by name", cluster.BackupsExternal, "https://link-local.example", "169.254.10.1 is a link-local address"},
		{"pod network by name", cluster.BackupsExternal, "http://mapped.example:9000", "10.42.3.4 is in the cluster's pod network 10.42.0.0/16"},
		{"Service network", cluster.BackupsExternal, "http://10.43.0.10:9000", "is in the cluster's Service network"},
		{"a node's address", cluster.BackupsExternal, "http://" + nodeIP + ":9000", "is node " + node.Name + "'s address"},
		{"a Service's address", cluster.BackupsExternal, "http://" + svc.Spec.ClusterIP + ":9000", "is the address of Service " + ns + "/store"},
		{"a Service's external IP", cluster.BackupsExternal, "http://192.0.2.50:9000", "is the address of Service " + ns + "/store"},
		{"a Service's endpoint", cluster.BackupsExternal, "http://192.0.2.60:9000", "is an endpoint of Service " + ns + "/store"},
		{"a name that does not resolve", cluster.BackupsExternal, "https://nowhere.example", "nowhere.example does not resolve from this machine"},
		{"outside, by name", cluster.BackupsExternal, "https://backups.example", ""},
		{"AWS", cluster.BackupsExternal, "", ""},
	} {
		rec.Backups = tc.backups
		if tc.endpoint != "as started" && tc.backups == cluster.BackupsExternal {
			setEndpoint(tc.endpoint)
		}
		err := backup.CheckOutside(ctx, f.cl, rec, lookup)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v; want an error with %q", tc.name, err, tc.want)
		}
	}
}
