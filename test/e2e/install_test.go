package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/testenv"
)

// The install tests' hosts: a 4 GiB server (nano) and an 8 GiB one that can carry Longhorn.
const (
	nanoHost      = 4  // index in Lab.Hosts: lab5
	longhornHost  = 5  // lab6
	nanoAfterHost = 19 // lab20
)

// installArgs are the flags every install test passes: the host, lab's root key, the stand-in's
// airgap bundle, and --yes (kip runs without a terminal).
func installArgs(s *e2e.Suite, h *lab.Host, bundle string, extra ...string) []string {
	args := []string{"install", "--host", h.PublicIP.String(), "--ssh-key", h.KeyPath, "--airgap-bundle", bundle, "--yes",
		"--admin-email", "admin@example.com"}
	return append(args, extra...)
}

// untouched fails the test when kip left k3s, its configuration or a kip-managed firewall on h.
func untouched(ctx context.Context, t *testing.T, h *lab.Host) {
	t.Helper()
	out, err := h.Run(ctx, "ls -d /usr/local/bin/k3s /etc/rancher /etc/systemd/system/k3s.service /etc/modules-load.d/kipper.conf 2>/dev/null; (ufw status 2>/dev/null || true) | grep -x 'Status: active'; true")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "" {
		t.Fatalf("the host was changed:\n%s", out)
	}
}

func clientsFor(t *testing.T, kubeconfig string) *kube.Clients {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kube.NewClients(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// plannedTitles are the step titles a dry run lists ("~ Title").
func plannedTitles(stderr string) []string {
	var titles []string
	for _, line := range strings.Split(stderr, "\n") {
		if t, ok := strings.CutPrefix(line, "~ "); ok {
			titles = append(titles, strings.TrimSpace(t))
		}
	}
	return titles
}

// restartK3s is the title of the one step a new run applies again however the last one ended:
// once k3s has served, every run restarts it once so that it loads the configuration kip wrote.
const restartK3s = "Restart k3s on kip's configuration"

// nodeReadyStep is the title of the one step that writes nothing: it waits for k3s to register its
// node Ready, which k3s does by itself while it starts. Whether a dry run still lists it depends on
// how far k3s got, and a run that finds the node Ready skips it, so no kill is aimed at it (a kill
// there could only be raced, and there is no write to interrupt).
const nodeReadyStep = "Wait for the server's node to be Ready"

// killedAtEachStep runs install again and again, killed by kip's own fault points
// (workflow.FaultEnv) before and then after the change of the next step, until there is none. The
// next step is the first that a fresh dry run plans and that was not killed at yet: the dry run on
// a bare host names the components without their versions and lists none of the steps that need
// the cluster. A run after one killed after a step's change must find that step done. The wait for
// the server's node (nodeReadyStep) is passed over. It returns the titles killed at, in order.
func killedAtEachStep(t *testing.T, s *e2e.Suite, home string, h *lab.Host) []string {
	t.Helper()
	var killed []string
	for range 100 {
		r := s.Kip(t, home, installArgs(s, h, s.Bundle, "--dry-run")...)
		if r.ExitCode != 0 {
			t.Fatalf("--dry-run after kills at %q: exit %d\n%s", killed, r.ExitCode, r.Stderr)
		}
		next := ""
		for _, title := range plannedTitles(r.Stderr) {
			if title != nodeReadyStep && !slices.Contains(killed, title) {
				next = title
				break
			}
		}
		if next == "" {
			return killed
		}
		for _, point := range []string{"before:" + next, "after:" + next} {
			r := s.KipEnv(t, home, []string{workflow.FaultEnv + "=" + point}, installArgs(s, h, s.Bundle)...)
			if r.Signal != syscall.SIGKILL || !strings.Contains(r.Stderr, "kipfault: SIGKILL at "+point+" ") {
				t.Fatalf("install with %s=%s: exit %d (signal %v), want it killed there:\n%s", workflow.FaultEnv, point, r.ExitCode, r.Signal, r.Stderr)
			}
			if n := len(killed); n > 0 && killed[n-1] != restartK3s && strings.Contains(r.Stderr, "\n… "+killed[n-1]+"\n") {
				t.Fatalf("install with %s=%s applied step %q again, which the run killed after its change had made:\n%s", workflow.FaultEnv, point, killed[n-1], r.Stderr)
			}
		}
		killed = append(killed, next)
		t.Logf("killed install before and after step %q", next)
	}
	t.Fatalf("install still plans steps after kills at %q", killed)
	return nil
}

// TestInstallNano is the nano install on a 4 GiB host: refusals that change nothing (a damaged
// bundle, --storage longhorn, --dry-run), an install killed at each step and run again until it
// completes, and what the completed install left. TestNanoAfterInstall has what comes after an
// install, on a cluster of its own.
func TestInstallNano(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	h := s.Own(t, nanoHost)[0]
	e2e.LogK3sOnFailure(t, h)
	home := s.Home(t)
	if err := e2e.UploadChartFixtures(ctx, h); err != nil {
		t.Fatal(err)
	}

	// A bundle whose binary does not match its checksum file is refused before anything changes.
	bad := t.TempDir()
	bin, err := os.ReadFile(filepath.Join(s.Bundle, "k3s"))
	if err != nil {
		t.Fatal(err)
	}
	bin[len(bin)/2] ^= 0xff
	sums, err := os.ReadFile(filepath.Join(s.Bundle, "sha256sum-amd64.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "k3s"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "sha256sum-amd64.txt"), sums, 0o644); err != nil {
		t.Fatal(err)
	}
	r := s.Kip(t, home, installArgs(s, h, bad)...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "the bundle is damaged or was altered") {
		t.Fatalf("a damaged bundle: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	untouched(ctx, t, h)

	// --storage longhorn on 4 GiB is refused before anything changes.
	r = s.Kip(t, home, installArgs(s, h, s.Bundle, "--storage", "longhorn")...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "--storage longhorn needs at least 6000 MiB of RAM") {
		t.Fatalf("--storage longhorn on 4 GiB: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	untouched(ctx, t, h)

	// Off a terminal and without --yes, install refuses before it connects anywhere.
	r = s.Kip(t, home, slices.DeleteFunc(installArgs(s, h, s.Bundle), func(a string) bool { return a == "--yes" })...)
	if r.ExitCode != 2 || !strings.Contains(r.Stderr, "--yes is required when not running interactively") || strings.Contains(r.Stderr, "Connecting") {
		t.Fatalf("install without --yes off a terminal: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	untouched(ctx, t, h)

	// A dry run plans and changes nothing.
	r = s.Kip(t, home, installArgs(s, h, s.Bundle, "--dry-run")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Nothing was changed") {
		t.Fatalf("--dry-run: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	for _, want := range []string{"Profile: nano", "Storage: local", "Pod network: VXLAN"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("--dry-run does not say %q", want)
		}
	}
	titles := plannedTitles(r.Stderr)
	if len(titles) < 8 {
		t.Fatalf("--dry-run planned %d steps: %q", len(titles), titles)
	}
	untouched(ctx, t, h)

	// Killed before and after each step's change (by kip's own fault points), the same command
	// continues; then it completes. Every step the dry run planned was killed at but the wait for
	// the server's node, which writes nothing (nodeReadyStep).
	phase := time.Now()
	killed := killedAtEachStep(t, s, home, h)
	e2e.Timing(t.Name()+": the install killed at each step", phase, "")
	for _, title := range titles {
		if title != nodeReadyStep && !slices.Contains(killed, title) {
			t.Errorf("install was never killed at step %q the dry run planned; killed at %q", title, killed)
		}
	}
	start := time.Now()
	r = s.Kip(t, home, installArgs(s, h, s.Bundle)...)
	if r.ExitCode != 0 {
		t.Fatalf("install after the kills: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("the completing run took %s", time.Since(start).Round(time.Second))
	for _, want := range []string{"Kipper is installed on " + h.PublicIP.String() + ": nano profile, local storage", "Kubeconfig: "} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("install's end does not say %q", want)
		}
	}

	// The last screen says where the console is and how to print the first admin's password, with
	// a command that works as written (kubectl from the test control plane's binaries).
	if !strings.Contains(r.Stderr, "Console: https://console."+h.PublicIP.String()+".sslip.io") {
		t.Errorf("install's end does not say where the console is:\n%s", r.Stderr)
	}
	_, rest, _ := strings.Cut(r.Stderr, "First admin: admin@example.com; the password is in the cluster, print it with:\n")
	passwordCmd, _, _ := strings.Cut(strings.TrimSpace(rest), "\n")
	bins, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", passwordCmd)
	cmd.Env = append(os.Environ(), "PATH="+bins+":"+os.Getenv("PATH"))
	password, err := cmd.Output()
	if err != nil || len(strings.TrimSpace(string(password))) < 16 {
		t.Errorf("the printed password command %q: %v (%d bytes)", passwordCmd, err, len(password))
	}

	kubeconfig := filepath.Join(home, "kubeconfigs", h.PublicIP.String()+".yaml")
	st, err := os.Stat(kubeconfig)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %s: %v, mode %v; want 0600", kubeconfig, err, st)
	}
	c := clientsFor(t, kubeconfig)
	rec, found, err := cluster.ReadRecord(ctx, c.Dynamic)
	if err != nil || !found || rec.Profile != "nano" || rec.Storage != cluster.StorageLocal || rec.Network != cluster.NetworkVXLAN || rec.Monitoring.Prometheus {
		t.Fatalf("cluster record %+v, found %v, %v", rec, found, err)
	}
	sc, err := c.Kube.StorageV1().StorageClasses().Get(ctx, "local-path", metav1.GetOptions{})
	if err != nil || sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
		t.Fatalf("local-path class: %v %v", sc.Annotations, err)
	}
	if _, err := c.Kube.CoreV1().Namespaces().Get(ctx, "longhorn-system", metav1.GetOptions{}); err == nil {
		t.Error("a nano cluster on local storage got longhorn-system")
	}
	helmCharts := schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}
	charts, err := c.Dynamic.Resource(helmCharts).Namespace("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range charts.Items {
		switch ch.GetName() {
		case "longhorn", "prometheus", "loki", "velero", "minio":
			t.Errorf("nano on local storage without backup storage got the %s chart", ch.GetName())
		}
	}
	ufw, err := h.Run(ctx, "ufw status verbose")
	if err != nil || !strings.Contains(ufw, "Status: active") || !strings.Contains(ufw, "6443/tcp") {
		t.Errorf("ufw after install: %v\n%s", err, ufw)
	}
	audit, err := h.Run(ctx, "test -s /var/lib/rancher/k3s/server/logs/audit.log && stat -c %a /etc/rancher/k3s/config.yaml")
	if err != nil || strings.TrimSpace(audit) != "600" {
		t.Errorf("audit log or config mode: %q %v", audit, err)
	}

}

// TestNanoAfterInstall is the nano path after its install, on a cluster of its own so that it
// runs beside TestInstallNano's install killed at each step: status and doctor, install's
// verification failures, a re-run that keeps the storage mode and the console's users and takes
// over the lock of a re-run killed holding it, kip platform, doctor failing on a broken host, the
// recovery of a restart, and the growth onto Longhorn, killed after each of its writes in turn.
func TestNanoAfterInstall(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	h := s.Own(t, nanoAfterHost)[0]
	e2e.LogK3sOnFailure(t, h)
	home := s.Home(t)
	if err := e2e.UploadChartFixtures(ctx, h); err != nil {
		t.Fatal(err)
	}
	if r := s.Kip(t, home, installArgs(s, h, s.Bundle)...); r.ExitCode != 0 {
		t.Fatalf("install: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	c := clientsFor(t, filepath.Join(home, "kubeconfigs", h.PublicIP.String()+".yaml"))
	rec, found, err := cluster.ReadRecord(ctx, c.Dynamic)
	if err != nil || !found {
		t.Fatalf("cluster record: found %v, %v", found, err)
	}
	helmCharts := schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}
	var r e2e.Result
	var phase time.Time

	// status and doctor report the installed cluster.
	r = s.Kip(t, home, "status")
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "nano") || !strings.Contains(r.Stdout, "local") {
		t.Fatalf("kip status: exit %d\n%s\n%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	// This host cannot load wireguard: "! lab5: wireguard not right (see Warnings), 5 passed". Its
	// disk is this machine's, shared by every lab host and the build: below 15% free, the disk
	// check warns too ("! lab20: wireguard, disk not right (see Warnings), 4 passed").
	if hosts := regexp.MustCompile(`\nHost checks\n  (✔ ` + h.Name + `: \d+ checks? passed|! ` + h.Name + `: (wireguard|disk|wireguard, disk) not right \(see Warnings\), \d+ passed)\n`); !hosts.MatchString(r.Stdout) {
		t.Errorf("kip status shows no host checks of %s:\n%s", h.Name, r.Stdout)
	}
	r = s.Kip(t, home, "doctor")
	if r.ExitCode != 0 {
		t.Fatalf("kip doctor on a healthy cluster: exit %d\n%s\n%s", r.ExitCode, r.Stdout, r.Stderr)
	}

	verificationFailures(ctx, t, s, home, h, c)

	// A re-run keeps the storage mode and refuses to switch it.
	r = s.Kip(t, home, installArgs(s, h, s.Bundle, "--storage", "longhorn")...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "never switches the storage mode") {
		t.Fatalf("re-run with --storage longhorn: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	// A user the console created (a static user in Dex's config) must survive the re-run.
	addConsoleUser(ctx, t, c, "dev@example.com")
	before, err := h.Run(ctx, "systemctl show k3s -p ActiveEnterTimestampMonotonic")
	if err != nil {
		t.Fatal(err)
	}
	r = s.Kip(t, home, installArgs(s, h, s.Bundle, "-v")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "re-running install") {
		t.Fatalf("re-run: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	// A re-run that changes nothing but k3s's restart reads the host in under 15 remote commands.
	if m := regexp.MustCompile(`(\d+) remote commands over one SSH connection[^\n]*`).FindStringSubmatch(r.Stderr); m == nil {
		t.Error("install -v does not count its remote commands")
	} else if n, _ := strconv.Atoi(m[1]); n >= 15 {
		t.Errorf("a re-run that changes nothing took %d remote commands, want under 15", n)
	} else {
		t.Logf("measured: re-run: %s", m[0])
	}
	// A re-run holds the cluster lock from its first host step, naming its whole command line:
	// killed just before it restarts k3s, it leaves the lock held, and the same command takes it
	// over (its process is gone) and finishes.
	killAt := workflow.FaultEnv + "=before:Restart k3s on kip's configuration"
	r = s.KipEnv(t, home, []string{killAt}, installArgs(s, h, s.Bundle)...)
	if r.Signal != syscall.SIGKILL {
		t.Fatalf("re-run with %s: exit %d, want it killed\n%s", killAt, r.ExitCode, r.Stderr)
	}
	lease, err := c.Kube.CoordinationV1().Leases("kube-system").Get(ctx, kube.LockName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the cluster lock during a re-run's host steps: %v", err)
	}
	if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); !strings.HasPrefix(holder, strings.Join(append([]string{"kip"}, installArgs(s, h, s.Bundle)...), " ")+" by ") {
		t.Errorf("lock holder %q, want the whole command line", holder)
	}
	r = s.Kip(t, home, installArgs(s, h, s.Bundle)...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Took over the cluster lock from kip install --host "+h.PublicIP.String()) {
		t.Fatalf("re-run after the kill: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	after, err := h.Run(ctx, "systemctl show k3s -p ActiveEnterTimestampMonotonic")
	if err != nil || after == before {
		t.Errorf("the re-run did not restart k3s (%q, %v)", after, err)
	}
	if users := consoleUsers(ctx, t, c); !slices.Contains(users, "dev@example.com") || !slices.Contains(users, "admin@example.com") {
		t.Errorf("Dex users after the re-run: %q; want the console's dev@example.com kept beside the admin", users)
	}
	if rec2, _, err := cluster.ReadRecord(ctx, c.Dynamic); err != nil || rec2.Storage != cluster.StorageLocal || !rec2.InstalledAt.Equal(rec.InstalledAt) {
		t.Errorf("record after re-run %+v, %v", rec2, err)
	}

	// kip platform: the profile shown and kept within the server's size; Prometheus on and off.
	r = s.Kip(t, home, "platform", "profile", "show", "-o", "json")
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, `"name": "nano"`) || !strings.Contains(r.Stdout, `"serverMemoryMiB": 4096`) {
		t.Errorf("platform profile show: exit %d\n%s%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	r = s.Kip(t, home, "platform", "profile", "set", "small")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "the small profile needs at least 6000 MiB") {
		t.Errorf("platform profile set small on 4 GiB: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	r = s.Kip(t, home, "platform", "enable", "prometheus")
	if r.ExitCode != 0 {
		t.Fatalf("platform enable prometheus: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if _, err := c.Dynamic.Resource(helmCharts).Namespace("kube-system").Get(ctx, "prometheus", metav1.GetOptions{}); err != nil {
		t.Errorf("prometheus chart after enable: %v", err)
	}
	if rec, _, err := cluster.ReadRecord(ctx, c.Dynamic); err != nil || !rec.Monitoring.Prometheus || rec.Monitoring.Loki {
		t.Errorf("record after enable: %+v %v", rec.Monitoring, err)
	}
	if r = s.Kip(t, home, "platform", "disable", "prometheus"); r.ExitCode != 2 || !strings.Contains(r.Stderr, "--yes is required") {
		t.Errorf("platform disable without a terminal or --yes: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if r = s.Kip(t, home, "platform", "disable", "prometheus", "--yes"); r.ExitCode != 0 {
		t.Fatalf("platform disable prometheus: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if _, err := c.Dynamic.Resource(helmCharts).Namespace("kube-system").Get(ctx, "prometheus", metav1.GetOptions{}); err == nil {
		t.Error("the prometheus chart is still there after disable")
	}
	if rec, _, err := cluster.ReadRecord(ctx, c.Dynamic); err != nil || rec.Monitoring.Prometheus {
		t.Errorf("record after disable: %+v %v", rec.Monitoring, err)
	}
	platformPaths(ctx, t, s, home, h, c)

	// Doctor fails, with SSH, on a host whose k3s is down.
	if _, err := h.Run(ctx, "systemctl stop k3s"); err != nil {
		t.Fatal(err)
	}
	r = s.Kip(t, home, "doctor")
	if r.ExitCode != 1 {
		t.Errorf("kip doctor with k3s stopped: exit %d, want 1\n%s\n%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	if _, err := h.Run(ctx, "systemctl start k3s"); err != nil {
		t.Fatal(err)
	}

	restartRecovery(ctx, t, s, home, h)
	phase = time.Now()
	growOntoLonghorn(ctx, t, s, home, h, c)
	e2e.Timing(t.Name()+": grown onto Longhorn", phase, "")
}

// verificationFailures breaks what install's verification pods check, on the installed nano
// cluster, and runs install again each time: it fails naming the node and what failed. Cluster
// DNS: CoreDNS scaled to 0. Service routing: the API's ClusterIP dropped for pods on the host.
// Mended, install passes again.
func verificationFailures(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h *lab.Host, c *kube.Clients) {
	t.Helper()
	scale := func(n int) {
		t.Helper()
		if _, err := h.Run(ctx, sshx.Command("k3s", "kubectl", "-n", "kube-system", "scale", "deployment", "coredns", "--replicas="+strconv.Itoa(n))); err != nil {
			t.Fatal(err)
		}
		if err := kube.WaitRollout(ctx, c, "Deployment", "kube-system", "coredns", 3*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	scale(0)
	r := s.Kip(t, home, installArgs(s, h, s.Bundle)...)
	if want := "verification on node " + h.Name + " failed: cluster DNS does not answer"; r.ExitCode != 1 || !strings.Contains(r.Stderr, want) {
		t.Fatalf("install with CoreDNS scaled to 0: exit %d, want 1 and %q\n%s", r.ExitCode, want, r.Stderr)
	}
	scale(1)

	drop := []string{"PREROUTING", "-s", "10.42.0.0/16", "-d", "10.43.0.1", "-p", "tcp", "--dport", "443", "-j", "DROP"}
	if _, err := h.Run(ctx, sshx.Command("iptables", append([]string{"-w", "-t", "mangle", "-I"}, drop...)...)); err != nil {
		t.Fatal(err)
	}
	r = s.Kip(t, home, installArgs(s, h, s.Bundle)...)
	if want := "verification on node " + h.Name + " failed: Service routing does not work"; r.ExitCode != 1 || !strings.Contains(r.Stderr, want) {
		t.Errorf("install with the API's ClusterIP dropped: exit %d, want 1 and %q\n%s", r.ExitCode, want, r.Stderr)
	}
	if _, err := h.Run(ctx, sshx.Command("iptables", append([]string{"-w", "-t", "mangle", "-D"}, drop...)...)); err != nil {
		t.Fatal(err)
	}
	if r = s.Kip(t, home, installArgs(s, h, s.Bundle)...); r.ExitCode != 0 {
		t.Fatalf("install with DNS and Service routing mended: exit %d\n%s", r.ExitCode, r.Stderr)
	}
}

// TestInstallLonghorn installs on an 8 GiB host: the small profile with Longhorn, its host
// packages really installed, Longhorn's pinned settings and a non-default longhorn class.
func TestInstallLonghorn(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	h := s.Own(t, longhornHost)[0]
	e2e.LogK3sOnFailure(t, h)
	home := s.Home(t)

	// What the charts would create, for the stand-in's helm-controller: Longhorn's CRDs and its
	// stock longhorn class, which the chart marks default.
	if err := e2e.UploadChartFixtures(ctx, h); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := s.Kip(t, home, installArgs(s, h, s.Bundle, "-v")...)
	if r.ExitCode != 0 {
		t.Fatalf("install: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("install with Longhorn took %s", time.Since(start).Round(time.Second))
	if m := regexp.MustCompile(`\d+ remote commands over one SSH connection[^\n]*`).FindString(r.Stderr); m == "" {
		t.Error("install -v does not count its remote commands")
	} else {
		t.Logf("measured: %s", m)
	}
	for _, want := range []string{"Profile: small", "Storage: longhorn", "Installed Longhorn's host packages"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("install does not say %q", want)
		}
	}
	if out, err := h.Run(ctx, "dpkg-query -W -f='${db:Status-Status}\\n' open-iscsi nfs-common"); err != nil || out != "installed\ninstalled\n" {
		t.Errorf("Longhorn's packages: %q %v", out, err)
	}
	c := clientsFor(t, filepath.Join(home, "kubeconfigs", h.PublicIP.String()+".yaml"))
	rec, _, err := cluster.ReadRecord(ctx, c.Dynamic)
	if err != nil || rec.Storage != cluster.StorageLonghorn || rec.Profile != "small" || rec.Backups != "in-cluster" {
		t.Fatalf("cluster record %+v, %v", rec, err)
	}
	settings := schema.GroupVersionResource{Group: "longhorn.io", Version: "v1beta2", Resource: "settings"}
	for name, want := range map[string]string{
		"upgrade-checker": "false", "fast-replica-rebuild-enabled": "false", "default-data-locality": "disabled",
		"replica-auto-balance": "disabled", "allow-volume-creation-with-degraded-availability": "true",
	} {
		st, err := c.Dynamic.Resource(settings).Namespace("longhorn-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("Longhorn setting %s: %v", name, err)
			continue
		}
		if v, _ := st.Object["value"].(string); v != want {
			t.Errorf("Longhorn setting %s = %q, want %q", name, v, want)
		}
	}
	classes, err := c.Kube.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, sc := range classes.Items {
		if sc.Annotations["storageclass.kubernetes.io/is-default-class"] == "true" {
			defaults = append(defaults, sc.Name)
		}
	}
	if len(defaults) != 1 || defaults[0] != "local-path" {
		t.Errorf("default classes %q, want only local-path", defaults)
	}
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 || nodes.Items[0].Status.NodeInfo.KubeletVersion != "v1.37.2+k3s1" {
		t.Fatalf("nodes: %v %v", nodes, err)
	}
	if !nodeReady(&nodes.Items[0]) {
		t.Error("the server's node is not Ready")
	}
	r = s.Kip(t, home, "status", "-o", "json")
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, `"longhorn"`) {
		t.Errorf("kip status -o json: exit %d\n%s", r.ExitCode, r.Stdout)
	}

	// kip platform profile set that succeeds, down to nano and back.
	for _, profile := range []string{"nano", "small"} {
		if r = s.Kip(t, home, "platform", "profile", "set", profile); r.ExitCode != 0 {
			t.Fatalf("platform profile set %s on 8 GiB: exit %d\n%s", profile, r.ExitCode, r.Stderr)
		}
		if rec, _, err := cluster.ReadRecord(ctx, c.Dynamic); err != nil || rec.Profile != profile {
			t.Errorf("record after profile set %s: %+v %v", profile, rec, err)
		}
	}

	externalBackupsKept(ctx, t, s, home, h, c)
	upgradeOnLab(ctx, t, s, home, c)
}

// externalBackupsKept re-runs install with external backup storage, then again without the
// backup flags: the second run keeps Velero on the bucket and the credentials the cluster holds.
// Before, it rendered Velero pointed at in-cluster MinIO while the record still said external.
// The bucket's endpoint need not answer: no Velero runs in the lab.
func externalBackupsKept(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h *lab.Host, c *kube.Clients) {
	t.Helper()
	keyFile := filepath.Join(t.TempDir(), "secret-key")
	if err := os.WriteFile(keyFile, []byte("wJalrXUtnFEMIEXAMPLEKEY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := s.Kip(t, home, installArgs(s, h, s.Bundle, "--backup-storage-bucket", "kip-backups", "--backup-storage-endpoint", "https://s3.example.com",
		"--backup-storage-access-key-id", "AKIAEXAMPLE", "--backup-storage-secret-access-key-file", keyFile)...)
	if r.ExitCode != 0 {
		t.Fatalf("re-run with external backup storage: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if strings.Contains(r.Stderr, "wJalrXUtnFEMIEXAMPLEKEY") {
		t.Error("install printed the secret key")
	}
	creds, err := c.Kube.CoreV1().Secrets("velero").Get(ctx, "velero-credentials", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("velero-credentials after the re-run with keys: %v", err)
	}
	want := &cluster.BackupLocation{Bucket: "kip-backups", Endpoint: "https://s3.example.com"}

	r = s.Kip(t, home, installArgs(s, h, s.Bundle)...)
	if r.ExitCode != 0 {
		t.Fatalf("re-run without the backup flags: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	rec, _, err := cluster.ReadRecord(ctx, c.Dynamic)
	if err != nil || rec.Backups != cluster.BackupsExternal || !rec.BackupLocation.Equal(want) {
		t.Fatalf("record after the re-run without flags: %+v %v", rec, err)
	}
	helmCharts := schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}
	chart, err := c.Dynamic.Resource(helmCharts).Namespace("kube-system").Get(ctx, "velero", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	content, _, _ := unstructured.NestedString(chart.Object, "spec", "valuesContent")
	var values struct {
		Credentials struct {
			ExistingSecret string `json:"existingSecret"`
		} `json:"credentials"`
		Configuration struct {
			BackupStorageLocation []struct {
				Bucket string            `json:"bucket"`
				Config map[string]string `json:"config"`
			} `json:"backupStorageLocation"`
		} `json:"configuration"`
	}
	if err := yaml.Unmarshal([]byte(content), &values); err != nil {
		t.Fatal(err)
	}
	bsl := values.Configuration.BackupStorageLocation
	if len(bsl) != 1 || bsl[0].Bucket != "kip-backups" || bsl[0].Config["s3Url"] != "https://s3.example.com" || values.Credentials.ExistingSecret != "velero-credentials" {
		t.Errorf("Velero after the re-run without flags: %+v, credentials %q; want the external bucket", bsl, values.Credentials.ExistingSecret)
	}
	after, err := c.Kube.CoreV1().Secrets("velero").Get(ctx, "velero-credentials", metav1.GetOptions{})
	if err != nil || after.ResourceVersion != creds.ResourceVersion {
		t.Errorf("velero-credentials changed by a re-run without keys (%v)", err)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// consoleUsers are the static users in the cluster's Dex config.
func consoleUsers(ctx context.Context, t *testing.T, c *kube.Clients) []string {
	t.Helper()
	cfg, err := components.ReadDexConfig(ctx, c)
	if err != nil || cfg == nil {
		t.Fatalf("read the Dex config: %v (found: %v)", err, cfg != nil)
	}
	users, err := components.DexUsers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return users
}

// addConsoleUser adds a static user to Dex's config as the console does.
func addConsoleUser(ctx context.Context, t *testing.T, c *kube.Clients, email string) {
	t.Helper()
	s, err := c.Kube.CoreV1().Secrets("dex").Get(ctx, "dex-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(s.Data["config.yaml"], &cfg); err != nil {
		t.Fatal(err)
	}
	users, _ := cfg["staticPasswords"].([]any)
	cfg["staticPasswords"] = append(users, map[string]any{
		"email": email, "username": email, "userID": "console-" + email,
		"hash": "$2a$10$2b2cU8CPhOTaGrs1HRQuAueS7JTT5ZHsHSzYiFPm1leZck7Mc8T4W",
	})
	if s.Data["config.yaml"], err = yaml.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kube.CoreV1().Secrets("dex").Update(ctx, s, metav1.UpdateOptions{FieldManager: "kipper-console"}); err != nil {
		t.Fatal(err)
	}
	if users := consoleUsers(ctx, t, c); !slices.Contains(users, email) {
		t.Fatalf("added %s, Dex users now %q", email, users)
	}
}
