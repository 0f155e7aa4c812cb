package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kipper.run/kip/test/need"
)

// TestReleaseBinDir: a stand-in claiming a release runs the binaries of that release's
// Kubernetes when the binaries' directory has them (bin/testenv/v1.36.3, sh tools/testenv.sh
// older), else the directory's own, with a warning when its VERSION names another release.
func TestReleaseBinDir(t *testing.T) {
	bin := t.TempDir()
	writeFile(t, filepath.Join(bin, "VERSION"), "v1.37.2\n")
	for _, tc := range []struct {
		version, want, warn string
	}{
		{"v1.37.2+k3s1", bin, ""},
		{"v1.36.3+k3s1", bin, "holds Kubernetes v1.37.2 and no v1.36.3/"},
	} {
		dir, warning := releaseBinDir(bin, tc.version)
		if dir != tc.want || (tc.warn == "") != (warning == "") || !strings.Contains(warning, tc.warn) {
			t.Errorf("releaseBinDir(%s) = %s, %q; want %s and a warning containing %q", tc.version, dir, warning, tc.want, tc.warn)
		}
	}
	older := filepath.Join(bin, "v1.36.3")
	if err := os.Mkdir(older, 0o755); err != nil {
		t.Fatal(err)
	}
	if dir, warning := releaseBinDir(bin, "v1.36.3+k3s1"); dir != older || warning != "" {
		t.Errorf("releaseBinDir(v1.36.3+k3s1) = %s, %q; want %s", dir, warning, older)
	}
	if dir, _ := releaseBinDir(bin, "v1.37.2+k3s1"); dir != bin {
		t.Errorf("releaseBinDir(v1.37.2+k3s1) = %s; want %s", dir, bin)
	}

	// The option follows.
	writeFile(t, filepath.Join(bin, "config.yaml"), "")
	env := map[string]string{"K3S_CONFIG_FILE": filepath.Join(bin, "config.yaml"), "KIP_STANDIN_BIN": bin}
	o, err := parseOptions("agent", nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	o.useReleaseBinDir("v1.36.3+k3s1")
	if got := o.str("standin-bin-dir"); got != older {
		t.Errorf("standin-bin-dir = %s after useReleaseBinDir, want %s", got, older)
	}
}

// builtRelease is the Kubernetes release of the build in dir (its VERSION file, which
// tools/testenv.sh writes).
func builtRelease(t *testing.T, dir string) string {
	t.Helper()
	return strings.TrimSpace(string(readFile(t, filepath.Join(dir, "VERSION"))))
}

// TestReleaseUpgrade upgrades a server in place from the older release to the pinned one, as
// kip upgrade --k3s replaces the binary and restarts k3s: a stand-in claiming testVersion
// (v1.36.3+k3s1) runs the older build in bin/testenv/v1.36.3 (make testenv-older; skipped
// without it locally, failed under CI=true), its kube-apiserver /version v1.36.3; the stand-in of the pinned release, started
// on the same data directory, runs bin/testenv's build, reports its release and finds what the
// older one stored (etcd v3.6's data read by etcd v3.7, objects written by kube-apiserver v1.36).
func TestReleaseUpgrade(t *testing.T) {
	t.Parallel() // with TestServerAndAgent and TestAddons
	binDir := testBinDir(t)
	olderDir, _ := releaseBinDir(binDir, testVersion)
	if olderDir == binDir {
		need.Missing(t, "no build of %s's Kubernetes in %s: make testenv-older builds it", testVersion, binDir)
	}
	older, pinned := standinBinary(t), pinnedStandinBinary(t)
	out, err := exec.Command(pinned, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	pinnedVersion := strings.Fields(string(out))[2] // k3s version v1.37.2+k3s1 (…)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	ports := freePortRange(t, 6)
	httpsPort, kubeletPort := ports+4, ports+5
	kubeconfig := filepath.Join(dir, "k3s.yaml")
	writeFile(t, filepath.Join(dir, "config.yaml"), fmt.Sprintf("node-name: standin-upgrade\nnode-ip: 127.0.0.1\nbind-address: 127.0.0.1\n"+
		"https-listen-port: %d\nwrite-kubeconfig-mode: \"0600\"\ntoken: upgrade-secret\nkubelet-arg: [port=%d]\n", httpsPort, kubeletPort))
	args := []string{"server", "--config", filepath.Join(dir, "config.yaml"), "--data-dir", filepath.Join(dir, "data"), "--write-kubeconfig", kubeconfig}
	env := []string{"KIP_STANDIN_BIN=" + binDir, "KIP_STANDIN_PORT_BASE=" + strconv.Itoa(ports)}

	check := func(phase, claimed, release string) kubernetes.Interface {
		t.Helper()
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		kube := kubernetes.NewForConfigOrDie(cfg)
		v, err := kube.Discovery().ServerVersion()
		if err != nil || v.GitVersion != release {
			t.Errorf("%s: /version = %+v, %v; want gitVersion %s", phase, v, err, release)
		}
		eventually(t, time.Minute, phase+": node Ready", func() error { return nodeReady(ctx, kube, "standin-upgrade") })
		n, err := kube.CoreV1().Nodes().Get(ctx, "standin-upgrade", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Status.NodeInfo.KubeletVersion != claimed {
			t.Errorf("%s: kubeletVersion %s, want %s", phase, n.Status.NodeInfo.KubeletVersion, claimed)
		}
		t.Logf("%s: /version %s, node %s", phase, v.GitVersion, n.Status.NodeInfo.KubeletVersion)
		return kube
	}

	s := startStandinBinary(t, older, dir, "older", args, env)
	t.Logf("older server start (process start to READY=1): %s", s.waitReady(t, 2*time.Minute).Round(time.Millisecond))
	kube := check("before the upgrade", testVersion, builtRelease(t, olderDir))
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"}, Data: map[string]string{"written-by": testVersion}}
	if _, err := kube.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.stop(t)

	s = startStandinBinary(t, pinned, dir, "pinned", args, env)
	t.Logf("upgraded server start (process start to READY=1): %s", s.waitReady(t, 2*time.Minute).Round(time.Millisecond))
	kube = check("after the upgrade", pinnedVersion, builtRelease(t, binDir))
	got, err := kube.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{})
	if err != nil || got.Data["written-by"] != testVersion {
		t.Errorf("ConfigMap written before the upgrade: %+v, %v", got, err)
	}
}
