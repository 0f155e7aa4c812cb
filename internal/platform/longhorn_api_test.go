package platform

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/testenv"
)

// TestSwitchToLonghornRefusalsAndList: an older platform is refused before any host is reached,
// naming the re-run of install that brings it up to date; a cluster already on Longhorn lists each
// service volume still local with the command that moves it, as written.
func TestSwitchToLonghornRefusalsAndList(t *testing.T) {
	env := testenv.Get(t)
	c, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	setRecord := func(storage, kip string) {
		t.Helper()
		if _, err := cluster.UpdateRecord(ctx, c.Dynamic, func(r *cluster.Record, _ bool) error {
			*r = cluster.Record{Profile: "nano", Storage: storage, Server: "203.0.113.10", KipVersion: kip, Network: cluster.NetworkWireGuard}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	errOut := &bytes.Buffer{}
	ios := &cli.IOStreams{Out: &bytes.Buffer{}, ErrOut: errOut, Getenv: func(string) string { return "" }}
	o := &LonghornOptions{Options: Options{Kube: func() (*kube.Clients, error) { return c, nil }, Printer: cli.NewPrinter(ios),
		Prompter: cli.NewPrompter(ios, true), Holder: "kip cluster storage longhorn (test)", KipVersion: "v0.2.0"},
		Dial: func(context.Context, string) (*sshx.Client, error) {
			t.Error("kip dialled the server")
			return nil, context.Canceled
		}}

	setRecord(cluster.StorageLocal, "v0.1.0")
	err = SwitchToLonghorn(ctx, o)
	want := "the platform was installed or last upgraded by kip v0.1.0 and this is kip v0.2.0: the move relies on admission policies this kip installs, " +
		"so bring the platform up to date first by running 'kip upgrade' with this kip"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("an older platform: %v\nwant %q", err, want)
	}

	// A service on a local volume, in a project's namespace.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop-staging", Labels: map[string]string{service.ProjectLabel: "shop"}}}
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": "db", "namespace": "shop-staging"}, "spec": map[string]any{"type": "postgres"}}}
	if _, err := c.Dynamic.Resource(service.ServicesGVR).Namespace("shop-staging").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-local-db"}, Spec: corev1.PersistentVolumeSpec{
		Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		ClaimRef:               &corev1.ObjectReference{Namespace: "shop-staging", Name: "data-db-0"},
		PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/rancher/k3s/storage/pvc-local-db_shop-staging_data-db-0"}}}}
	if _, err := c.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer c.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{}) //nolint:errcheck // cleanup
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-db-0", Namespace: "shop-staging"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: new(string), VolumeName: pv.Name,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := c.Kube.CoreV1().PersistentVolumeClaims("shop-staging").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	setRecord(cluster.StorageLonghorn, "v0.2.0")
	if err := SwitchToLonghorn(ctx, o); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"The cluster's storage is already Longhorn", "1 service volume(s) are still on local storage",
		"db in shop-staging (/var/lib/rancher/k3s/storage/pvc-local-db_shop-staging_data-db-0): kip service storage longhorn db --project shop --environment staging --no-backup\n",
		"without backups nothing could restore a service whose move went wrong: each command passes --no-backup"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, errOut)
		}
	}
}
