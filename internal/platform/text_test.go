package platform

import (
	"kipper.run/kip/internal/cluster"

	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// sampleReport has a chart in every state, a recorded console-api build and an init container.
func sampleReport() *VersionsReport {
	updated := time.Date(2026, 7, 1, 10, 30, 0, 0, time.UTC)
	return &VersionsReport{
		Kip:        KipVersions{Recorded: "v0.3.0", Running: "v0.4.0"},
		ConsoleAPI: ConsoleAPIBuild{Recorded: true, Version: "v1.8.0", Commit: "0a1b2c3", StartedAt: "2026-07-01T10:31:00Z", Pod: "console-api-7d9f-abcde"},
		PinnedK3s:  "v1.37.2+k3s1",
		Nodes: []NodeVersion{
			{Name: "srv", Role: cluster.RoleServer, Kubernetes: "v1.37.2+k3s1", ContainerRuntime: "containerd://2.1.4-k3s1", OSImage: "Debian GNU/Linux 13 (trixie)"},
			{Name: "w1", Role: cluster.RoleWorker, Kubernetes: "v1.36.4+k3s1"},
		},
		Charts: []ChartVersion{
			{Component: "traefik", Release: "traefik", Namespace: "traefik", Chart: "traefik", Pinned: "41.6.0", HelmChart: "41.6.0",
				Installed: "41.6.0", AppVersion: "v3.7.13", Revision: 1, Status: "deployed", Updated: &updated, State: ChartOK},
			{Component: "cert-manager", Release: "cert-manager", Namespace: "cert-manager", Chart: "cert-manager", Pinned: "v1.21.2",
				HelmChart: "v1.21.2", State: ChartNoRelease},
			{Component: "longhorn", Release: "longhorn", Namespace: "longhorn-system", Chart: "longhorn", Pinned: "1.11.3", State: ChartNotInstalled},
			{Component: "dex", Release: "dex", Namespace: "dex", Chart: "dex", Pinned: "0.24.0", HelmChart: "0.24.0",
				Installed: "0.24.0", AppVersion: "2.44.0", Revision: 3, Status: "failed", Description: `Upgrade "dex" failed: context deadline exceeded`,
				Updated: &updated, Deployed: &Revision{Revision: 2, Chart: "0.23.0"}, State: ChartFailed,
				Fix: failedReleaseFix("203.0.113.10", "dex", "dex")},
			{Component: "zot", Release: "zot", Namespace: "zot", Chart: "zot", Pinned: "0.1.122", HelmChart: "0.1.122",
				Installed: "0.1.120", AppVersion: "v2.1.15", Revision: 2, Status: "deployed", Updated: &updated, State: ChartDiffers},
			{Component: "keda", Release: "keda", Namespace: "keda", Chart: "keda", Pinned: "2.20.2", HelmChart: "2.20.2",
				Installed: "2.20.2", AppVersion: "2.20.2", Revision: 1, Status: "pending-install", State: ChartPending},
			{Component: "velero", Release: "velero", Namespace: "velero", Chart: "velero", Pinned: "12.1.0", State: ChartError,
				Error: "read Helm release velero in velero: query: failed to query with labels: forbidden"},
		},
		Namespaces: []string{"kipper-system", "traefik", "kube-system"},
		Workloads: []Workload{
			{Namespace: "kipper-system", Kind: "Deployment", Name: "console-api", Images: []Image{
				{Container: "migrate", Image: "ghcr.io/getkipper/kipper-console-api:latest", Init: true},
				{Container: "console-api", Image: "ghcr.io/getkipper/kipper-console-api:latest"}}},
			{Namespace: "traefik", Kind: "DaemonSet", Name: "svclb-traefik", Images: []Image{{Container: "lb-tcp-80", Image: "rancher/klipper-lb:v0.4.13"}}},
			{Namespace: "kube-system", Kind: "Deployment", Name: "coredns", Images: []Image{{Container: "coredns", Image: "rancher/mirrored-coredns-coredns:1.12.3"}}},
		},
		Warnings: []string{"node w1 runs v1.36.4+k3s1, this kip pins k3s v1.37.2+k3s1"},
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./internal/platform -run %s -update writes it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test ./internal/platform -run %s -update rewrites it); got:\n%s", path, t.Name(), got)
	}
}

func TestVersionsText(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteText(&b); err != nil {
		t.Fatal(err)
	}
	golden(t, "versions.txt", b.Bytes())
}

// TestVersionsTextUnrecorded: a cluster whose App CRD and console-api record nothing, with no
// workloads.
func TestVersionsTextUnrecorded(t *testing.T) {
	r := &VersionsReport{Kip: KipVersions{Running: "dev"}, PinnedK3s: "v1.37.2+k3s1", Namespaces: []string{"kipper-system", "kube-system"}}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	golden(t, "versions-unrecorded.txt", b.Bytes())
}

// TestVersionsJSON pins the documented shape of -o json (docs/platform.md).
func TestVersionsJSON(t *testing.T) {
	b, err := json.MarshalIndent(sampleReport(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "versions.json", append(b, '\n'))
}
