package kube_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

const twoContexts = `apiVersion: v1
kind: Config
clusters:
- name: a
  cluster: {server: "https://a.example:6443"}
- name: b
  cluster: {server: "https://b.example:6443"}
users:
- name: u
  user: {token: secret}
contexts:
- name: first
  context: {cluster: a, user: u}
- name: second
  context: {cluster: b, user: u}
current-context: first
`

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "config", twoContexts)
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")

	tests := []struct {
		name, path, context, env string
		wantHost, wantErr        string
	}{
		{name: "explicit path, current context", path: path, wantHost: "https://a.example:6443"},
		{name: "explicit path, other context", path: path, context: "second", wantHost: "https://b.example:6443"},
		{name: "KUBECONFIG", env: path, wantHost: "https://a.example:6443"},
		{name: "explicit path wins over KUBECONFIG", path: path, env: "/nonexistent/config", context: "second", wantHost: "https://b.example:6443"},
		{name: "unknown context", path: path, context: "third", wantErr: `no context "third" (contexts: first, second)`},
		{name: "explicit path missing", path: filepath.Join(dir, "missing"), wantErr: "load kubeconfig: stat " + filepath.Join(dir, "missing") + ": no such file or directory"},
		{name: "nothing anywhere", wantErr: "no kubeconfig found: looked in " + filepath.Join(os.Getenv("HOME"), ".kube", "config") + "; pass --kubeconfig or set KUBECONFIG"},
		{name: "KUBECONFIG names missing files", env: "/nonexistent/a:/nonexistent/b", wantErr: "no kubeconfig found: looked in $KUBECONFIG (/nonexistent/a, /nonexistent/b)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tt.env)
			cfg, err := kube.LoadConfig(tt.path, tt.context)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tt.wantHost || cfg.BearerToken != "secret" {
				t.Errorf("host %s token %q, want %s and the user's token", cfg.Host, cfg.BearerToken, tt.wantHost)
			}
		})
	}
}

func TestNewClientsMakesNoRequest(t *testing.T) {
	// Nothing listens on this address: building clients must not dial it.
	c, err := kube.NewClients(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.Config.UserAgent, "kip/"+buildinfo.Version+" (") {
		t.Errorf("user agent %q, want kip/<version>", c.Config.UserAgent)
	}
	if c.Kube == nil || c.Dynamic == nil || c.APIExt == nil || c.Longhorn == nil || c.Mapper == nil {
		t.Errorf("a client is missing: %+v", c)
	}
	own, err := kube.NewClients(&rest.Config{Host: "https://127.0.0.1:1", UserAgent: "kip-test"})
	if err != nil {
		t.Fatal(err)
	}
	if own.Config.UserAgent != "kip-test" {
		t.Errorf("user agent %q, want the caller's", own.Config.UserAgent)
	}
	if _, err := kube.NewClients(nil); err == nil {
		t.Error("NewClients(nil) succeeded")
	}
}

func TestSchemeConvertsVeleroBackup(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "velero.io/v1",
		"kind":       "Backup",
		"metadata":   map[string]any{"name": "nightly", "namespace": "velero"},
		"spec":       map[string]any{"includedNamespaces": []any{"apps"}, "storageLocation": "default"},
		"status":     map[string]any{"phase": "Completed"},
	}}
	obj, err := kube.Scheme().New(schema.GroupVersionKind{Group: "velero.io", Version: "v1", Kind: "Backup"})
	if err != nil {
		t.Fatal(err)
	}
	b := obj.(*velerov1.Backup)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, b); err != nil {
		t.Fatal(err)
	}
	if b.Status.Phase != velerov1.BackupPhaseCompleted || b.Spec.StorageLocation != "default" || b.Spec.IncludedNamespaces[0] != "apps" {
		t.Errorf("converted backup %+v", b)
	}
	for _, gvk := range []schema.GroupVersionKind{
		{Group: "apps", Version: "v1", Kind: "Deployment"},
		{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"},
		{Group: "longhorn.io", Version: "v1beta2", Kind: "Volume"},
	} {
		if !kube.Scheme().Recognizes(gvk) {
			t.Errorf("Scheme does not know %s", gvk)
		}
	}
}

// TestClientsAgainstAPIServer loads the test environment's kubeconfig as kip would and uses every
// client.
func TestClientsAgainstAPIServer(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	cfg, err := kube.LoadConfig(env.KubeconfigPath, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := kube.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v, err := c.Kube.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server %s", v.GitVersion)
	if _, err := c.Longhorn.LonghornV1beta2().Volumes(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list longhorn volumes: %v", err)
	}
	if _, err := c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "backups.velero.io", metav1.GetOptions{}); err != nil {
		t.Errorf("get velero CRD: %v", err)
	}
	m, err := c.Mapper.RESTMapping(schema.GroupKind{Group: "velero.io", Kind: "Backup"}, "v1")
	if err != nil {
		t.Fatal(err)
	}
	if m.Resource.Resource != "backups" || m.Scope.Name() != "namespace" {
		t.Errorf("mapping %+v", m)
	}
	list, err := c.Dynamic.Resource(m.Resource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("list backups: %v, %d items", err, len(list.Items))
	}
}
