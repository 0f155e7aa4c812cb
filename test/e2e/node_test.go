package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	"golang.org/x/crypto/ssh"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/node"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/status"
	"kipper.run/kip/internal/workflow"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/longhorn-standin/standin"
)

// The node test's hosts: a Longhorn server and the worker it joins (indexes in Lab.Hosts).
const (
	nodeServerHost  = 10 // lab11
	nodeWorkerHost  = 11 // lab12
	nodeWorker2Host = 13 // lab14
	publicServer    = 14 // lab15
	publicWorker    = 15 // lab16
	fenceServer     = 16 // lab17
	fenceWorkerHost = 17 // lab18
)

// TestNodeAdd installs a Longhorn cluster on lab11 and joins lab12 to it as a worker, in private
// mode found from the hosts' routing tables: a blocked 6443 on the private network stops the
// join naming the connection and changes nothing; an overlapping --private-network is refused;
// the join moves the server's k3s onto the private network, opens the peer ports on both
// kip-managed firewalls (proven by real connections from a node and from a host that is none),
// holds ordinary pods off the worker until its checks pass, and records it; a join killed before
// its checks resumes only with the options it started with, and one with the cluster registry
// stopped stops at its checks naming it; run again, it changes nothing. Then a second worker
// joins and is given up (secondWorker), and kip node remove takes the worker out again (see
// removeWorker). The fence has a cluster of its own (TestNodeFence), which runs beside this one.
func TestNodeAdd(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	own := s.Own(t, nodeServerHost, nodeWorkerHost, nodeWorker2Host)
	srv, w, outsider := own[0], own[1], s.Lab.Hosts[0]
	e2e.LogK3sOnFailure(t, srv)
	e2e.LogK3sOnFailure(t, w)
	e2e.LogK3sOnFailure(t, own[2])
	home, _, c := longhornServer(ctx, t, s, srv)
	// The operator's key logs in to every node the way it logs in to the server.
	authorize(t, srv, w)
	add := func(extra ...string) []string {
		return append([]string{"node", "add", w.PublicIP.String(), "--airgap-bundle", s.Bundle, "--yes"}, extra...)
	}

	// The server's 6443 blocked on the private network: the join stops before changing anything.
	unblock := blockAPI(ctx, t, w, srv)
	r := s.Kip(t, home, add()...)
	want := fmt.Sprintf("the node cannot connect to the server's API at %s:6443 over private network 10.77.0.0/24", srv.PrivateIP)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "or pass --public") {
		t.Fatalf("join with 6443 blocked: exit %d, want 1 and %q\n%s", r.ExitCode, want, r.Stderr)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || rec.Mode != "" || len(rec.Workers) != 0 {
		t.Errorf("the refused join recorded %+v (%v)", rec, err)
	}
	if _, err := w.Run(ctx, "test ! -e /usr/local/bin/k3s"); err != nil {
		t.Errorf("the refused join installed k3s on the worker: %v", err)
	}
	unblock()
	if r := s.Kip(t, home, add("--private-network", "10.42.7.0/24")...); r.ExitCode != 2 || !strings.Contains(r.Stderr, "overlaps the cluster's pod or Service network") {
		t.Errorf("an overlapping --private-network: exit %d\n%s", r.ExitCode, r.Stderr)
	}

	// The join killed before and after the change of each step it applies, then run again: a
	// run after one killed after a step's change finds that step done. Once the worker runs
	// (after k3s-start), a resume with other options is refused and an ordinary pod waits while
	// the joining taint holds it off.
	var joined time.Duration
	var last, original string
	var released time.Time // when the run that lifts the joining taint started
	for _, step := range joinSteps {
		for _, point := range []string{"before:" + step, "after:" + step} {
			env := []string{workflow.FaultEnv + "=" + point}
			var r e2e.Result
			if point == "after:release" {
				released = time.Now()
			}
			if point == "before:verify" {
				registryDown(ctx, t, s, home, c, w, add)
			}
			if point == "after:longhorn" {
				r = joinWithLonghorn(ctx, t, s, home, c, srv, w, env, add("-v")...)
			} else {
				if point == "after:server-network" {
					original = serverMoveKilled(ctx, t, s, home, srv, add("-v")...)
					// The first start of k3s on the moved configuration fails once, as when its
					// kube-proxy ends it: kip waits for systemd to start it again.
					if out, err := srv.Run(ctx, "mkdir -p /etc/k3s-standin && echo fail-changed-config-once > /etc/k3s-standin/fault"); err != nil {
						t.Fatalf("%v\n%s", err, out)
					}
				}
				r = s.KipEnv(t, home, env, add("-v")...)
			}
			if r.Signal != syscall.SIGKILL || !strings.Contains(r.Stderr, "kipfault: SIGKILL at "+point+" ") {
				t.Fatalf("join with %s=%s: exit %d (signal %v), want it killed there:\n%s", workflow.FaultEnv, point, r.ExitCode, r.Signal, r.Stderr)
			}
			if last != "" && strings.Contains(r.Stderr, "step "+last+":") {
				t.Fatalf("join with %s=%s applied step %s again, which the run killed after its change had made:\n%s", workflow.FaultEnv, point, last, r.Stderr)
			}
			if point == "after:"+step {
				joined += logStep(t, step, r.Stderr)
			}
			if step == "server-network" && point == "after:"+step {
				if !strings.Contains(r.Stderr, "waiting for systemd to start it again") {
					t.Errorf("the join did not wait out the failed start of k3s:\n%s", r.Stderr)
				}
				if out, err := srv.Run(ctx, "test ! -e /etc/k3s-standin/fault && echo gone"); err != nil || strings.TrimSpace(out) != "gone" {
					t.Errorf("the stand-in's fault was not used: %v %q", err, out)
				}
				serverMoved(ctx, t, srv, original)
				if want := "Network: private network 10.77.0.0/24 (server " + srv.PrivateIP.String(); !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "found in both hosts' routing tables") {
					t.Errorf("the join does not say %q, found in both hosts' routing tables:\n%s", want, r.Stderr)
				}
			}
		}
		last = step
		if step == "k3s-start" {
			heldOff(ctx, t, s, home, c, w, add)
		}
	}
	e2e.Timing(t.Name()+": install, and the join killed at each step", began, "")
	t.Logf("measured: the join's steps took %s in all, apt's Longhorn packages included", joined.Round(time.Second))
	scheduled := waitPod(ctx, t, c, "ordinary", corev1.PodRunning, 3*time.Minute)
	t.Logf("measured: the ordinary pod waiting for the worker ran %s after the kip node add that lifted the joining taint started",
		scheduled.Status.StartTime.Sub(released).Round(time.Second))
	r = s.Kip(t, home, add()...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "6443/tcp from each worker to the server") {
		t.Fatalf("join after every kill: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if scheduled.Spec.NodeName != w.Name {
		t.Errorf("the ordinary pod runs on %s", scheduled.Spec.NodeName)
	}

	rec, err := cluster.ReadNodes(ctx, c.Dynamic)
	if err != nil {
		t.Fatal(err)
	}
	wr := rec.Workers[w.Name]
	if rec.Mode != cluster.ModePrivate || rec.Server != srv.PrivateIP || wr.State != cluster.WorkerReady || wr.Path.Node != w.PrivateIP || !wr.FirewallManaged {
		t.Errorf("nodes record %+v", rec)
	}
	server, err := c.Kube.CoreV1().Nodes().Get(ctx, srv.Name, metav1.GetOptions{})
	if err != nil || nodeAddress(server, corev1.NodeInternalIP) != srv.PrivateIP.String() || nodeAddress(server, corev1.NodeExternalIP) != srv.PublicIP.String() {
		t.Errorf("the server's node after the move: %v %v", err, server.Status.Addresses)
	}

	// The firewalls, by real connections: the peer ports open to the nodes only, SSH open to
	// all, 8888 closed to outside traffic although something listens there.
	listener := podOn("listener", w.Name, "exec httpd -f -p 8888")
	listener.Spec.HostNetwork = true
	listener.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, listener, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(ctx, t, c, "listener", corev1.PodRunning, 2*time.Minute)
	for _, tc := range []struct {
		from *lab.Host
		to   *lab.Host
		port int
		want bool
	}{
		{w, srv, 10250, true}, {outsider, srv, 10250, false},
		{srv, w, 10250, true}, {outsider, w, 10250, false},
		{outsider, w, 22, true},
		{w, w, 8888, true}, {outsider, w, 8888, false},
	} {
		to := tc.to.PrivateIP.String()
		if tc.from == tc.to {
			to = "127.0.0.1"
		}
		if got := connects(ctx, t, tc.from, to, tc.port); got != tc.want {
			t.Errorf("%s → %s:%d connects %v, want %v", tc.from.Name, tc.to.Name, tc.port, got, tc.want)
		}
	}

	r = s.Kip(t, home, "node", "list", "-o", "json")
	var listed []node.Listed
	if err := json.Unmarshal([]byte(r.Stdout), &listed); r.ExitCode != 0 || err != nil || len(listed) != 2 ||
		listed[1].Name != w.Name || listed[1].Mode != cluster.ModePrivate || listed[1].State != cluster.WorkerReady || listed[1].Status != cluster.NodeReady {
		t.Errorf("kip node list -o json: exit %d, %v\n%s", r.ExitCode, err, r.Stdout)
	}

	// Run again, the join changes nothing and keeps the workload.
	r = s.Kip(t, home, add()...)
	if r.ExitCode != 0 || strings.Contains(r.Stderr, "Installed k3s") || !strings.Contains(r.Stderr, "already Ready") {
		t.Errorf("join again: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if p, err := c.Kube.CoreV1().Pods("default").Get(ctx, "ordinary", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning || p.UID != scheduled.UID {
		t.Errorf("the ordinary pod after the rejoin: %v", err)
	}
	if n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{}); err != nil || n.Spec.Unschedulable {
		t.Errorf("the worker after the rejoin is still cordoned: %v", err)
	}
	diskCheck(ctx, t, s, home, c, w)
	rerunInstall(ctx, t, s, home, c, srv, w, scheduled)
	// The Longhorn stand-in's manager runs on the server, which placement and the reboot's
	// copies step need.
	if err := standin.Install(ctx, srv, c); err != nil {
		t.Fatal(err)
	}
	standin.LogOnFailure(t, srv)
	standin.LogOnFailure(t, w)
	phase := time.Now()
	secondWorker(ctx, t, s, home, c, srv, w, own[2], outsider)
	e2e.Timing(t.Name()+": the second worker", phase, "")
	removeWorker(ctx, t, s, home, c, srv, w, outsider)
}

// TestNodeFence installs a Longhorn cluster on lab17, joins lab18 to it as a worker, and fences
// the worker once it stops reporting, then rejoins it (see fenceWorker).
func TestNodeFence(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	own := s.Own(t, fenceServer, fenceWorkerHost)
	srv, w := own[0], own[1]
	e2e.LogK3sOnFailure(t, srv)
	e2e.LogK3sOnFailure(t, w)
	home, _, c := longhornServer(ctx, t, s, srv)
	authorize(t, srv, w)
	if r := joinWithLonghorn(ctx, t, s, home, c, srv, w, nil, "node", "add", w.PublicIP.String(), "--airgap-bundle", s.Bundle, "--yes"); r.ExitCode != 0 {
		t.Fatalf("join: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	fenceWorker(ctx, t, s, home, c, srv, w)
}

// longhornServer installs a Longhorn cluster on srv with the real kip, from a KIP_HOME of its
// own, and returns that home, the kubeconfig kip saved and clients from it.
func longhornServer(ctx context.Context, t *testing.T, s *e2e.Suite, srv *lab.Host) (string, string, *kube.Clients) {
	t.Helper()
	home := s.Home(t)
	if err := e2e.UploadChartFixtures(ctx, srv); err != nil {
		t.Fatal(err)
	}
	if r := s.Kip(t, home, installArgs(s, srv, s.Bundle, "--storage", "longhorn")...); r.ExitCode != 0 {
		t.Fatalf("install: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	kubeconfig := filepath.Join(home, "kubeconfigs", srv.PublicIP.String()+".yaml")
	return home, kubeconfig, clientsFor(t, kubeconfig)
}

// joinWithLonghorn runs the join args (kip node add of w) with env, and starts Longhorn's node
// plugin on w (the stand-in's, as Longhorn's DaemonSet would start it there) while the join
// waits at its Longhorn check, paused before it.
func joinWithLonghorn(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w *lab.Host, env []string, args ...string) e2e.Result {
	t.Helper()
	return joinWithLonghornPaused(ctx, t, s, home, c, srv, w, env, nil, args...)
}

// joinWithLonghornPaused is joinWithLonghorn that also runs whilePaused (when not nil) while the
// join waits, paused, with the worker recorded as joining.
func joinWithLonghornPaused(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w *lab.Host, env []string, whilePaused func(), args ...string) e2e.Result {
	t.Helper()
	p, pause := s.Paused(t, home, env, "before:longhorn", args...)
	if whilePaused != nil {
		whilePaused()
	}
	admin, err := os.ReadFile(filepath.Join(home, "kubeconfigs", srv.PublicIP.String()+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := standin.InstallNode(ctx, w, c, admin); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pause); err != nil {
		t.Fatal(err)
	}
	return p.Wait(t, 10*time.Minute)
}

// fenceWorker fences the worker once it stopped reporting, and rejoins it. Three Kipper services
// run there first (servicesOnWorker): current, with its copy on the server; stale, whose copy
// on the server failed before its last write; only, with its copies on the worker. Cut off from
// the server's API (its 6443 rejected on the worker), the worker turns NotReady; once it has been
// for a minute, and with kip's SSH to it cut too (its public link down), a fence --powered-off
// is refused because its kubelet still answers the server. With SSH back, its k3s-agent stopped
// (its containers run on) and the server's API reachable from it again, the fence stops
// k3s-agent and every container behind the drop-in, killed after each step it applies and run
// again (killed after its services step, before the taint, kip service start still counts the
// worker as fenced and does not start stale); current starts on the server with every line the
// worker's pod wrote; stale stays stopped, and only stays stopped with the recipe for a lost
// worker, neither with a pod on another node (the fence waited for the slow console to scale
// them down before the taint); kip status names both
// stranded, and why. kip service start refuses only, and starts stale on the older copy with
// --accept-stale-data: it holds the first line, not the second. The fenced node lists as
// OutOfService, and kip node reboot and remove refuse it. kip node add then rejoins it: it
// reboots the host, which has not booted since the fence (the drop-in keeps k3s-agent stopped
// through that reboot: checked while the rejoin is paused after it), lifts the fence step by
// step (Ready, untainted, uncordoned, the fence forgotten) and starts only with every line it
// wrote on the worker (its copies rebuilt on the server meanwhile, the rejoin's cordon having
// Longhorn evict them), and an ordinary pod runs there again. The rejoin is killed right after
// each write it makes and run again (Suite.KillEveryWrite). The services are deleted then,
// with their data and their project.
func fenceWorker(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w *lab.Host) {
	t.Helper()
	on := servicesOnWorker(ctx, t, s, home, c, srv, w)
	unblock := blockAPI(ctx, t, w, srv)
	notReadyForAMinute(ctx, t, c, w)
	fence := []string{"node", "fence", w.Name, "--yes"}

	// Partitioned: kip cannot reach it over SSH, but its kubelet answers the server.
	if err := w.Partition(ctx, "public"); err != nil {
		t.Fatal(err)
	}
	r := s.Kip(t, home, append(fence, "--powered-off")...)
	if want := "the kubelet of " + w.Name + " still answers the server at " + w.PrivateIP.String() + ":10250"; r.ExitCode != 1 || !strings.Contains(r.Stderr, want) {
		t.Errorf("fence of a partitioned worker: exit %d, want %q\n%s", r.ExitCode, want, r.Stderr)
	}
	if err := w.Heal(ctx, "public"); err != nil {
		t.Fatal(err)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || rec.Workers[w.Name].Fence != nil {
		t.Fatalf("the refused fence recorded %+v (%v)", rec.Workers[w.Name], err)
	}
	// Its k3s-agent stops (the containers run on, writing), and it reaches the server's API
	// again: a fence finds it not cut off from the server, so Longhorn's record of the copies
	// stands (a worker cut off makes no copy elsewhere current: TestFenceCutOff).
	if out, err := w.Run(ctx, "systemctl stop k3s-agent"); err != nil {
		t.Fatalf("stop k3s-agent on %s: %v\n%s", w.Name, err, out)
	}
	unblock()

	// It answers: the fence stops it, killed after each step it applies and run again. current
	// starts on the server once Kubernetes, told by the taint, has deleted its pod and detached
	// its volumes (kip deletes the pod itself if it is left a minute after the taint); the
	// others stay stopped. Off a terminal, --yes accepts no older data.
	for _, step := range []string{"record", "stop", "services", "taint"} {
		r := s.KipEnv(t, home, []string{workflow.FaultEnv + "=after:" + step}, fence...)
		if r.Signal != syscall.SIGKILL || !strings.Contains(r.Stderr, "kipfault: SIGKILL at after:"+step+" ") {
			t.Fatalf("fence killed after %s: exit %d (signal %v)\n%s", step, r.ExitCode, r.Signal, r.Stderr)
		}
		if step == "services" {
			// Killed before its taint: the worker is untainted, but the fence's record is the
			// truth, so its own copy does not count and stale does not start without consent.
			r := s.Kip(t, home, "service", "start", on.stale.Name, "--project", on.stale.Project, "--environment", on.stale.Environment)
			if r.ExitCode != 1 || !strings.Contains(r.Stderr, "run kip service start "+on.stale.Name) {
				t.Errorf("kip service start %s with the fence killed before its taint: exit %d\n%s", on.stale, r.ExitCode, r.Stderr)
			}
		}
	}
	r = s.Kip(t, home, fence...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "k3s is already stopped on "+w.Name+" by the fence") ||
		!strings.Contains(r.Stderr, "Fenced worker "+w.Name+": it stays out of service until kip node add "+w.PublicIP.String()+" rejoins it") {
		t.Fatalf("fence resumed: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	for _, want := range []string{
		"Service " + on.current.String() + " runs again on " + srv.Name,
		"Service " + on.stale.String() + " stays stopped: no node but " + w.Name + " holds a copy of its data known to be current, and older data was not accepted",
		"Service " + on.only.String() + " stays stopped: its only copy of some volume is on " + w.Name + ", so it stays stopped until " + w.Name + " rejoins",
	} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("the fence does not say %q:\n%s", want, r.Stderr)
		}
	}
	if pod, got := serviceData(ctx, t, c, on.current); pod.Spec.NodeName != srv.Name || !strings.HasPrefix(got, on.printed[on.current]+" written by ") {
		t.Errorf("service %s after the fence: on %s, its volume holds %q; want on %s, after %q", on.current, pod.Spec.NodeName, got, srv.Name, on.printed[on.current])
	}
	// The console stand-in is slow (console.Delay): the fence waited for it to scale the stopped
	// services to zero before the taint, so no pod of theirs started on another node.
	for _, ref := range []service.Ref{on.stale, on.only} {
		pods, err := c.Kube.CoreV1().Pods(ref.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: service.Label + "=" + ref.Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != w.Name {
				t.Errorf("service %s, which the fence stopped, has pod %s on %s", ref, p.Name, p.Spec.NodeName)
			}
		}
	}
	// kip status names the services the fence left stopped, and why.
	r = s.Kip(t, home, "status")
	for _, want := range []string{
		"service " + on.stale.String() + " is stranded: the fence of " + w.Name + " stopped it (no node but " + w.Name + " holds a copy of its data known to be current)",
		"service " + on.only.String() + " is stranded: the fence of " + w.Name + " stopped it (its only copy of some volume is on " + w.Name + "): rejoin " +
			w.Name + " with kip node add " + w.PublicIP.String(),
	} {
		if !strings.Contains(r.Stdout+r.Stderr, want) {
			t.Errorf("kip status with %s fenced (exit %d) does not say %q:\n%s%s", w.Name, r.ExitCode, want, r.Stdout, r.Stderr)
		}
	}
	startFenced(ctx, t, s, home, c, srv, w, on)
	stopped := "test -f " + k3s.FenceDropIn + " && ! systemctl is-active --quiet k3s-agent && ! systemctl is-active --quiet " + standin.Unit +
		" && ! pgrep -f '[c]ontainerd-shim' && ! grep -q -e ' /var/lib/kubelet/pods/' -e ' /var/lib/kubelet/plugins/' /proc/self/mounts"
	if out, err := w.Run(ctx, stopped); err != nil {
		t.Errorf("the fenced worker still runs k3s, a container or a kubelet mount: %v\n%s", err, out)
	}
	r = s.Kip(t, home, "node", "list", "-o", "json")
	var listed []node.Listed
	if err := json.Unmarshal([]byte(r.Stdout), &listed); r.ExitCode != 0 || err != nil ||
		!slices.ContainsFunc(listed, func(l node.Listed) bool { return l.Name == w.Name && l.Status == cluster.NodeOutOfService }) {
		t.Errorf("kip node list -o json with %s fenced: exit %d, %v\n%s", w.Name, r.ExitCode, err, r.Stdout)
	}
	for _, cmd := range [][]string{{"node", "reboot", w.Name, "--yes"}, {"node", "remove", w.Name, "--yes"}} {
		if r := s.Kip(t, home, cmd...); r.ExitCode != 1 || !strings.Contains(r.Stderr, "worker "+w.Name+" is fenced (out of service)") {
			t.Errorf("kip %s of the fenced worker: exit %d, last line %q", strings.Join(cmd, " "), r.ExitCode, r.LastLine())
		}
	}

	// The rejoin lifts the fence, run again and again, each run killed right after the first
	// write no run before it made, until one finishes. The host has not booted since the fence,
	// so kip reboots it first: killed right after it told the host to reboot, the drop-in holds
	// k3s-agent stopped through that boot.
	bootBefore, err := w.Run(ctx, "cat /proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var said strings.Builder
	rebooted := false
	r, writes := s.KillEveryWrite(t, home, nil, func(write string, r e2e.Result) {
		said.WriteString(r.Stderr)
		if !strings.HasSuffix(write, "systemctl --no-block reboot") {
			return
		}
		rebooted = true
		if err := poll(ctx, 5*time.Minute, w.Name+" booted again", func(ctx context.Context) (bool, error) {
			boot, err := w.Run(ctx, "cat /proc/sys/kernel/random/boot_id")
			return err == nil && boot != bootBefore, nil
		}); err != nil {
			t.Fatal(err)
		}
		if out, err := w.Run(ctx, stopped); err != nil {
			t.Errorf("after the rejoin's reboot the fenced worker runs k3s, a container or a kubelet mount: %v\n%s", err, out)
		}
	}, "node", "add", w.PublicIP.String(), "--airgap-bundle", s.Bundle, "--yes")
	if r.ExitCode != 0 || !rebooted {
		t.Fatalf("rejoin of the fenced worker, resumed after each write: exit %d, rebooted %v, last line %q\n%s", r.ExitCode, rebooted, r.LastLine(), r.Stderr)
	}
	t.Logf("measured: the rejoin, killed after each of its %d writes and resumed, took %s", len(writes), time.Since(start).Round(time.Second))
	if all := said.String() + r.Stderr; !strings.Contains(all, "Lifted the out-of-service taint from "+w.Name) && !strings.Contains(all, w.Name+" is not tainted out of service") {
		t.Errorf("no run of the rejoin lifted the out-of-service taint")
	}
	n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
	if err != nil || cluster.NodeStatus(n) != cluster.NodeReady || n.Spec.Unschedulable {
		t.Errorf("the worker after its rejoin: %v", err)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || rec.Workers[w.Name].Fence != nil || rec.Workers[w.Name].State != cluster.WorkerReady {
		t.Errorf("the worker's record after its rejoin: %+v (%v)", rec.Workers[w.Name], err)
	}
	if _, err := w.Run(ctx, sshx.Command("test", "!", "-e", k3s.FenceDropIn)); err != nil {
		t.Errorf("the fence's drop-in is still on the rejoined worker: %v", err)
	}
	rejoined := podOn("rejoined", w.Name, "sleep 3600")
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, rejoined, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(ctx, t, c, "rejoined", corev1.PodRunning, 2*time.Minute)

	// The rejoin started the service the fence stopped (a run killed right after that write
	// never said so: the next finds it started).
	if svc, err := service.Get(ctx, c.Dynamic, on.only); err != nil || svc.Stopped || svc.FenceStop != "" {
		t.Errorf("service %s after the rejoin: %+v (%v); want it started, the fence's mark gone", on.only, svc, err)
	}
	if _, got := serviceData(ctx, t, c, on.only); !strings.HasPrefix(got, on.printed[on.only]+" written by ") {
		t.Errorf("service %s after the rejoin: its volume holds %q; want what it held on %s, %q, first", on.only, got, w.Name, on.printed[on.only])
	}

	// The services go, with their data and their project: the reboot after finds no Kipper
	// project to back up (this lab runs no Velero).
	for _, ref := range []service.Ref{on.current, on.stale, on.only} {
		if r := s.Kip(t, home, "service", "delete", ref.Name, "--project", ref.Project, "--environment", ref.Environment, "--delete-data", "--yes"); r.ExitCode != 0 {
			t.Fatalf("kip service delete %s: exit %d\n%s", ref, r.ExitCode, r.Stderr)
		}
	}
	if err := c.Dynamic.Resource(service.ProjectsGVR).Delete(ctx, on.current.Project, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 3*time.Minute, "namespace "+on.current.Namespace()+" gone", func(ctx context.Context) (bool, error) {
		_, err := c.Kube.CoreV1().Namespaces().Get(ctx, on.current.Namespace(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}); err != nil {
		t.Fatal(err)
	}
	// Each node's plugin removes the data of the copies on its disk once their volumes go, which
	// waits for Kubernetes to detach them: the attach-detach controller detaches a volume once
	// the node's kubelet reports it unmounted, which on a busy machine takes minutes.
	if err := kube.Poll(ctx, 5*time.Minute, "no copy's data left on "+srv.Name+" or "+w.Name, func(context.Context) (bool, string, error) {
		var left []string
		for _, h := range []*lab.Host{srv, w} {
			m, err := filepath.Glob(h.Path(standin.DataPath + "/replicas/*"))
			if err != nil {
				return false, "", err
			}
			for _, dir := range m {
				left = append(left, h.Name+":"+filepath.Base(dir))
			}
		}
		return len(left) == 0, "left: " + strings.Join(left, ", "), nil
	}); err != nil {
		t.Error(err)
	}
}

// startFenced starts the services the fence stopped, with the worker still fenced: kip service
// start refuses the one whose only copy is on the worker, shows the copies of the stale one and
// leaves it stopped without consent, and starts it with --accept-stale-data on the server's
// older copy, which holds the first line its pod wrote and not the second.
func startFenced(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w *lab.Host, on onWorker) {
	t.Helper()
	start := func(ref service.Ref, flags ...string) e2e.Result {
		return s.Kip(t, home, append([]string{"service", "start", ref.Name, "--project", ref.Project, "--environment", ref.Environment}, flags...)...)
	}
	if r := start(on.only); r.ExitCode != 1 || !strings.Contains(r.Stderr, "its only copy of some volume is on "+w.Name+", so it stays stopped until "+w.Name+" rejoins (kip node add "+w.PublicIP.String()+")") {
		t.Errorf("kip service start %s with its only copy on the fenced worker: exit %d\n%s", on.only, r.ExitCode, r.Stderr)
	}
	if r := start(on.stale); r.ExitCode != 1 || !strings.Contains(r.Stderr, "run kip service start "+on.stale.Name) {
		t.Errorf("kip service start %s without --accept-stale-data: exit %d\n%s", on.stale, r.ExitCode, r.Stderr)
	}
	if r := start(on.stale, "--accept-stale-data"); r.ExitCode != 0 {
		t.Fatalf("kip service start %s --accept-stale-data: exit %d\n%s", on.stale, r.ExitCode, r.Stderr)
	}
	before := lineIDs.FindAllString(on.printed[on.stale], -1)
	pod, got := serviceData(ctx, t, c, on.stale)
	if now := lineIDs.FindAllString(got, -1); pod.Spec.NodeName != srv.Name || len(before) != 2 || len(now) != 2 || now[0] != before[0] || now[1] == before[1] {
		t.Errorf("service %s on the older copy: on %s, its volume holds %q; want on %s, the first line of %q and a new one", on.stale, pod.Spec.NodeName, got, srv.Name, on.printed[on.stale])
	}
}

// lineIDs finds the ID in each line the services' containers write.
var lineIDs = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// onWorker are the Kipper services fenceWorker runs on the worker, one for each way a fence
// treats a service, and what each printed there: the lines its data volume held.
type onWorker struct {
	// current has its copies on the server: the fence starts it there.
	current service.Ref
	// stale has two copies, the server's failed before its last start on the worker: the fence
	// leaves it stopped until older data is accepted.
	stale service.Ref
	// only has its only copies on the worker: it stays stopped until the worker rejoins.
	only    service.Ref
	printed map[service.Ref]string
}

// servicesOnWorker runs onWorker's three services on w. The Longhorn stand-in runs on the server
// too (as Longhorn's manager there: the sidecars, and copies on the server's disk), and the
// console stand-in (slow: it acts on a service 10 s after it changed, as a busy console-api may)
// turns each service kip service add writes into a StatefulSet whose container
// appends a line to its data volume at every start and prints them all. The server is tainted
// meanwhile (keepPodsOff), so their pods run on w. current's copies are on the server, served to w on a loop
// device as Longhorn's engine on w would reach them; only's are on w, made while the server's
// Longhorn node allowed no scheduling; stale (two copies, after kip cluster storage --max-copies
// 2) has one on each, and its server copy is marked failed, as Longhorn marks a replica its
// engine lost, before it is stopped and started again (kip service stop and start, its volumes
// detached between) and its pod on w writes a second line to w's copy alone.
func servicesOnWorker(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w *lab.Host) onWorker {
	t.Helper()
	if err := standin.Install(ctx, srv, c); err != nil {
		t.Fatal(err)
	}
	standin.LogOnFailure(t, srv)
	standin.LogOnFailure(t, w)
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	console := &consolestandin.Standin{Kube: c.Kube, Dynamic: c.Dynamic, Image: busyboxImage,
		Command:     []string{"sh", "-c", appendLine},
		CopyHolders: cluster.CopyHolders, Interval: 5 * time.Second, Delay: 10 * time.Second, Logf: t.Logf}
	go func() { defer close(done); console.Run(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	on := onWorker{current: service.Ref{Project: "fence", Environment: "prod", Name: "db"},
		stale: service.Ref{Project: "fence", Environment: "prod", Name: "old"}, only: service.Ref{Project: "fence", Environment: "prod", Name: "only"},
		printed: map[service.Ref]string{}}
	createProject(ctx, t, c, "fence", "prod")
	for _, cmd := range [][]string{{"cluster", "storage", "--max-copies", "2"}, {"node", "storage", w.Name, "--copies", "--ignore-slow-disk"}} {
		if r := s.Kip(t, home, cmd...); r.ExitCode != 0 {
			t.Fatalf("kip %s: exit %d\n%s", strings.Join(cmd, " "), r.ExitCode, r.Stderr)
		}
	}
	add := func(ref service.Ref, flags ...string) {
		t.Helper()
		args := append([]string{"service", "add", "postgres", "--name", ref.Name, "--project", ref.Project, "--environment", ref.Environment, "--storage", "64Mi"}, flags...)
		if r := s.Kip(t, home, args...); r.ExitCode != 0 {
			t.Fatalf("kip %s: exit %d\n%s", strings.Join(args, " "), r.ExitCode, r.Stderr)
		}
		pod, printed := serviceData(ctx, t, c, ref)
		if pod.Spec.NodeName != w.Name || !strings.HasPrefix(printed, "written by ") {
			t.Fatalf("service %s runs on %s and its volume holds %q; want it on %s", ref, pod.Spec.NodeName, printed, w.Name)
		}
		on.printed[ref] = printed
	}
	defer keepPodsOff(ctx, t, c, srv)()
	add(on.current)
	add(on.stale, "--copies", "2")
	// only's volume as an earlier kip made one-copy volumes (not pinned to the server), while
	// the server takes no new copies.
	longhornScheduling(ctx, t, c, srv, false)
	pinned := unpinnedOneCopyClass(ctx, t, c)
	add(on.only)
	pinned()
	longhornScheduling(ctx, t, c, srv, true)

	// Where the copies are: current's on the server only, only's on the worker only, stale's on
	// both; each host holds the data of its copies.
	for ref, want := range map[service.Ref][]string{on.current: {srv.Name}, on.only: {w.Name}, on.stale: {srv.Name, w.Name}} {
		pod, _ := serviceData(ctx, t, c, ref)
		for _, r := range dataCopies(ctx, t, c, ref, pod) {
			if got := r.Spec.NodeID; !slices.Contains(want, got) {
				t.Errorf("service %s has a copy on %q, want copies on %v", ref, got, want)
			}
			for _, h := range []*lab.Host{srv, w} {
				img := h.Path(filepath.Join(standin.DataPath, "replicas", r.Spec.DataDirectoryName, "volume.img"))
				if _, err := os.Stat(img); (err == nil) != (r.Spec.NodeID == h.Name) {
					t.Errorf("service %s's copy %s on %s: its data on %s: %v", ref, r.Name, r.Spec.NodeID, h.Name, err)
				}
			}
		}
	}

	// stale's copy on the server fails; its pod starts again on the worker, which writes a
	// second line to its copy there alone.
	pod, _ := serviceData(ctx, t, c, on.stale)
	for _, r := range dataCopies(ctx, t, c, on.stale, pod) {
		if r.Spec.NodeID != srv.Name {
			continue
		}
		// The Longhorn stand-in writes its Replicas too: the change is made on the latest
		// one, again on a conflict.
		failed := time.Now().UTC().Format(time.RFC3339)
		replicas := c.Longhorn.LonghornV1beta2().Replicas("longhorn-system")
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			latest, err := replicas.Get(ctx, r.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			latest.Spec.FailedAt, latest.Spec.LastFailedAt = failed, failed
			_, err = replicas.Update(ctx, latest, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	flags := []string{on.stale.Name, "--project", on.stale.Project, "--environment", on.stale.Environment}
	if r := s.Kip(t, home, append([]string{"service", "stop"}, flags...)...); r.ExitCode != 0 {
		t.Fatalf("kip service stop %s: exit %d\n%s", on.stale, r.ExitCode, r.Stderr)
	}
	// Its volumes detach before it starts again, so that its engine runs without the failed copy.
	if err := kube.Poll(ctx, 2*time.Minute, "service "+on.stale.String()+"'s volumes detached", func(ctx context.Context) (bool, string, error) {
		for _, r := range dataCopies(ctx, t, c, on.stale, pod) {
			v, err := c.Longhorn.LonghornV1beta2().Volumes("longhorn-system").Get(ctx, r.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			if v.Status.State != lh.VolumeStateDetached {
				return false, fmt.Sprintf("volume %s is %s", v.Name, v.Status.State), nil
			}
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := s.Kip(t, home, append([]string{"service", "start"}, flags...)...); r.ExitCode != 0 {
		t.Fatalf("kip service start %s: exit %d\n%s", on.stale, r.ExitCode, r.Stderr)
	}
	again, printed := serviceData(ctx, t, c, on.stale)
	if again.UID == pod.UID || again.Spec.NodeName != w.Name || !strings.HasPrefix(printed, on.printed[on.stale]+" written by ") {
		t.Fatalf("service %s started again on %s printing %q; want on %s, after %q", on.stale, again.Spec.NodeName, printed, w.Name, on.printed[on.stale])
	}
	on.printed[on.stale] = printed
	return on
}

// keepPodsOff keeps new pods off h's node with a NoSchedule taint, until the func it returns
// lifts it. A cordon would do that too, but Longhorn (and its stand-in) evicts from a cordoned
// node each copy that is its volume's last healthy one, under the drain policy kip pins.
func keepPodsOff(ctx context.Context, t *testing.T, c *kube.Clients, h *lab.Host) func() {
	t.Helper()
	taint := corev1.Taint{Key: "kipper.run/test-elsewhere", Effect: corev1.TaintEffectNoSchedule}
	change := func(on bool) {
		t.Helper()
		// The kubelet writes the Node too (its status): the change is made on the latest one,
		// again on a conflict.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := c.Kube.CoreV1().Nodes().Get(ctx, h.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == taint.Key })
			if on {
				n.Spec.Taints = append(n.Spec.Taints, taint)
			}
			_, err = c.Kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	change(true)
	return func() { change(false) }
}

// longhornScheduling allows or disallows new copies on h's Longhorn node, as an operator does in
// Longhorn's node settings.
// unpinnedOneCopyClass makes the class of one-copy volumes as kip made it before it kept them on
// the server (no node selector), and returns what makes it as kip makes it now.
func unpinnedOneCopyClass(ctx context.Context, t *testing.T, c *kube.Clients) func() {
	t.Helper()
	scs := c.Kube.StorageV1().StorageClasses()
	now, err := scs.Get(ctx, cluster.LonghornOneCopyClass, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now.ObjectMeta = metav1.ObjectMeta{Name: now.Name, Labels: now.Labels, Annotations: now.Annotations}
	replace := func(sc *storagev1.StorageClass) {
		t.Helper()
		if err := scs.Delete(ctx, sc.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := scs.Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	older := now.DeepCopy()
	delete(older.Parameters, "nodeSelector")
	replace(older)
	return func() { replace(now) }
}

func longhornScheduling(ctx context.Context, t *testing.T, c *kube.Clients, h *lab.Host, allow bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"allowScheduling":%t}}`, allow)
	if _, err := c.Longhorn.LonghornV1beta2().Nodes("longhorn-system").Patch(ctx, h.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// dataCopies are the Longhorn replicas of the volumes of the service's pod.
func dataCopies(ctx context.Context, t *testing.T, c *kube.Clients, ref service.Ref, pod *corev1.Pod) []lh.Replica {
	t.Helper()
	var copies []lh.Replica
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		pvc, err := c.Kube.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, v.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		list, err := c.Longhorn.LonghornV1beta2().Replicas("longhorn-system").List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + pvc.Spec.VolumeName})
		if err != nil {
			t.Fatal(err)
		}
		copies = append(copies, list.Items...)
	}
	return copies
}

// serviceData waits until the service's pod is Ready and returns it with the first line it
// printed: what its data volume holds.
func serviceData(ctx context.Context, t *testing.T, c *kube.Clients, ref service.Ref) (*corev1.Pod, string) {
	t.Helper()
	var pod *corev1.Pod
	var line string
	if err := poll(ctx, 3*time.Minute, "service "+ref.String()+" Ready with its volume's line", func(ctx context.Context) (bool, error) {
		s, err := service.Get(ctx, c.Dynamic, ref)
		if err != nil {
			return false, err
		}
		pods, err := service.Pods(ctx, c.Kube, s)
		if err != nil {
			return false, err
		}
		pod, line = printedLine(ctx, c, pods, "")
		return pod != nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	return pod, line
}

// diskCheck runs kip node storage --copies on the worker's disk made fast and slow on purpose:
// a tmpfs over its Longhorn directory (syncs cost nothing) is eligible; its Longhorn disk held to
// 25 writes a second (the lab host's blkio cgroup) is slow, refused, then accepted with
// --ignore-slow-disk and recorded as overridden; held to 2 writes a second, a batch of 16 writes
// stalls for 8 s, half of Longhorn's replica timeout or more, refused even with the flag. The
// rates keep each verdict far from its threshold on a loaded machine: a synced write there is
// two writes (data and journal), so 25 a second makes a sync about 80 ms (16 of them about 1.3 s,
// against the 5 ms and 4 s limits); at 10 a second, 16 syncs took 3.5 to 4.3 s, across the 4 s
// limit as the machine's load went. After each verdict the worker's Longhorn node allows new
// copies exactly when the worker may hold them; the check on the tmpfs ends it, eligible.
func diskCheck(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, w *lab.Host) {
	t.Helper()
	check := []string{"node", "storage", w.Name, "--copies"}
	// The verdict recorded, and Longhorn told: new copies go to the worker only while it may
	// hold them.
	recorded := func(want string) {
		t.Helper()
		if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || rec.Workers[w.Name].Copies != want {
			t.Errorf("the worker's copies after the disk check: %+v (%v), want %s", rec.Workers[w.Name], err, want)
		}
		allow := want == cluster.CopiesEligible || want == cluster.CopiesOverridden
		if n, err := c.Longhorn.LonghornV1beta2().Nodes("longhorn-system").Get(ctx, w.Name, metav1.GetOptions{}); err != nil || n.Spec.AllowScheduling != allow {
			t.Errorf("the worker's Longhorn node after the disk check (%s): %v, want allowScheduling %v", want, err, allow)
		}
	}
	onTmpfs := func() {
		t.Helper()
		if _, err := w.Run(ctx, "mount -t tmpfs -o size=8m kip-fast-disk /var/lib/longhorn"); err != nil {
			t.Fatal(err)
		}
		r := s.Kip(t, home, check...)
		if _, err := w.Run(ctx, "umount /var/lib/longhorn"); err != nil {
			t.Fatal(err)
		}
		if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Worker "+w.Name+" may hold copies of volumes: 128 synced 4 KiB writes on kip-fast-disk (tmpfs)") {
			t.Errorf("disk check on a tmpfs: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		recorded(cluster.CopiesEligible)
	}
	onTmpfs()
	t.Cleanup(func() { _ = w.ThrottleLonghornDisk(0) })
	if err := w.ThrottleLonghornDisk(25); err != nil {
		t.Fatal(err)
	}
	r := s.Kip(t, home, check...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "to accept it anyway, run kip node storage "+w.Name+" --copies --ignore-slow-disk") {
		t.Errorf("disk check on a slow disk: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("measured on the disk held to 25 writes a second: %s", r.LastLine())
	recorded(cluster.CopiesRefused)
	r = s.Kip(t, home, append(check, "--ignore-slow-disk")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "accepted with --ignore-slow-disk") {
		t.Errorf("disk check on a slow disk with --ignore-slow-disk: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	recorded(cluster.CopiesOverridden)
	if err := w.ThrottleLonghornDisk(2); err != nil {
		t.Fatal(err)
	}
	r = s.Kip(t, home, append(check, "--ignore-slow-disk")...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "reaches half of Longhorn's replica timeout (8s)") {
		t.Errorf("disk check on a stalling disk: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	recorded(cluster.CopiesRefused)
	if err := w.ThrottleLonghornDisk(0); err != nil {
		t.Fatal(err)
	}
	// The worker may hold copies again, for what follows.
	onTmpfs()
}

// notReadyForAMinute waits until w's node has been NotReady (or Unknown) for over a minute, as a
// fence requires.
func notReadyForAMinute(ctx context.Context, t *testing.T, c *kube.Clients, w *lab.Host) {
	t.Helper()
	if err := poll(ctx, 5*time.Minute, "node "+w.Name+" NotReady for over a minute", func(ctx context.Context) (bool, error) {
		n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status != corev1.ConditionTrue && time.Since(cond.LastTransitionTime.Time) > node.FenceAfter+time.Second, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// rebootWorker reboots the worker with kip node reboot, the Deployment "drained" running there.
// The cluster keeps backups, but no Kipper project has a namespace yet, so there is nothing to
// back up (the backup step is proven against the API server and Velero elsewhere). Paused
// before its first step, a second node command is refused naming the reboot as the lock's
// holder; killed there, the reboot is run again and again, each run killed right after the
// first write no run before it made (Suite.KillEveryWrite), until one finishes: killed right
// after it told the host to reboot, the Deployment's pod runs on the server. The host boots
// again (a new boot ID), its node is Ready and schedulable, and the Deployment is Ready. The Deployment's volume (vol) had its only
// copy on the worker: the reboot's copies step had Longhorn (its stand-in) rebuild it on the
// server, so the pod there reads every line it wrote on the worker, whose disk no longer holds
// the old copy.
func rebootWorker(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w *lab.Host, vol string) {
	t.Helper()
	reboot := []string{"node", "reboot", w.Name, "--yes"}
	before := drainedData(ctx, t, c, w)
	// Ready, so that the reboot counts it among the workloads to wait for.
	if err := kube.WaitRollout(ctx, c, "Deployment", "default", "drained", time.Minute); err != nil {
		t.Fatal(err)
	}
	old, err := c.Longhorn.LonghornV1beta2().Replicas("longhorn-system").List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + vol + ",longhornnode=" + w.Name})
	if err != nil || len(old.Items) != 1 {
		t.Fatalf("the copy of volume %s on %s: %v (%v)", vol, w.Name, old, err)
	}
	bootBefore, err := w.Run(ctx, "cat /proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Paused before its first step, the reboot holds the cluster lock: another node command is
	// refused, naming it. Killed there, it is run again and again, killed after each write it
	// makes, each run resuming where the one before stopped.
	p, _ := s.Paused(t, home, nil, "before:copies", reboot...)
	r := s.Kip(t, home, "node", "remove", w.Name, "--yes")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "another kip command holds the cluster lock: kip node reboot "+w.Name) {
		t.Errorf("a remove during the reboot: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	p.Wait(t, time.Minute)
	var said strings.Builder
	r, writes := s.KillEveryWrite(t, home, nil, func(write string, r e2e.Result) {
		said.WriteString(r.Stderr)
		if !strings.HasSuffix(write, "systemctl --no-block reboot") {
			return
		}
		// Killed right after it told the host to reboot: the drain had moved the Deployment's
		// pod to the server.
		if pods, err := c.Kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=drained"}); err != nil ||
			len(pods.Items) != 1 || pods.Items[0].Spec.NodeName != srv.Name {
			t.Errorf("the Deployment's pods after the reboot's drain: %v %v", podNodes(pods), err)
		}
	}, reboot...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Rebooted worker "+w.Name+": it is Ready again, and so are the workloads that ran there (1 workload)") {
		t.Fatalf("reboot, resumed after each write: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	if !slices.ContainsFunc(writes, func(w string) bool { return strings.HasSuffix(w, "systemctl --no-block reboot") }) {
		t.Errorf("the reboot was not killed right after it told the host to reboot; it was killed after:\n%s", strings.Join(writes, "\n"))
	}
	t.Logf("measured: kip node reboot, killed after each of its %d writes and resumed, took %s", len(writes), time.Since(start).Round(time.Second))
	bootAfter, err := w.Run(ctx, "cat /proc/sys/kernel/random/boot_id")
	if err != nil || bootAfter == bootBefore {
		t.Errorf("the worker's boot ID %q before the reboot, %q after (%v)", bootBefore, bootAfter, err)
	}
	n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
	if err != nil || n.Spec.Unschedulable || cluster.NodeStatus(n) != cluster.NodeReady {
		t.Errorf("the worker after the reboot: %v", err)
	}
	if err := kube.WaitRollout(ctx, c, "Deployment", "default", "drained", time.Second); err != nil {
		t.Errorf("the Deployment after the reboot: %v", err)
	}

	// The volume's only copy moved to the server before the drain: the Deployment's pod there
	// reads every line it wrote on the worker, and the worker's disk no longer holds the old copy.
	if want := "Another node holds a current copy of " + vol; !strings.Contains(said.String()+r.Stderr, want) {
		t.Errorf("no run of the reboot says %q", want)
	}
	if got := drainedData(ctx, t, c, srv); !strings.HasPrefix(got, before+" written by ") {
		t.Errorf("the Deployment's volume after the reboot holds %q; want %q first", got, before)
	}
	reps, err := c.Longhorn.LonghornV1beta2().Replicas("longhorn-system").List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + vol})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps.Items {
		if r.Spec.NodeID != "" && (r.Spec.NodeID != srv.Name || r.Spec.HealthyAt == "" || r.Spec.FailedAt != "") {
			t.Errorf("volume %s after the reboot has copy %s on %q (healthy at %q, failed at %q); want its one copy on %s", vol, r.Name, r.Spec.NodeID, r.Spec.HealthyAt, r.Spec.FailedAt, srv.Name)
		}
	}
	gone := w.Path(filepath.Join(standin.DataPath, "replicas", old.Items[0].Spec.DataDirectoryName))
	if err := poll(ctx, time.Minute, "the old copy's data gone from "+w.Name, func(context.Context) (bool, error) {
		_, err := os.Stat(gone)
		return os.IsNotExist(err), nil
	}); err != nil {
		t.Error(err)
	}
}

// appendLine is a container's script that appends a line with a fresh ID to its data volume at
// every start, prints them all on one line, and runs until it is stopped.
const appendLine = `echo "written by $HOSTNAME: $(cat /proc/sys/kernel/random/uuid)" >> /data/kept && sync && ` +
	`tr '\n' ' ' < /data/kept | sed 's/ $//'; echo; trap "exit 0" TERM; while :; do sleep 1; done`

// drainedData waits until the Deployment "drained" has a running pod on h that printed what its
// volume holds, and returns that.
func drainedData(ctx context.Context, t *testing.T, c *kube.Clients, h *lab.Host) string {
	t.Helper()
	var line string
	if err := poll(ctx, 3*time.Minute, "the Deployment's pod on "+h.Name+" printing its volume", func(ctx context.Context) (bool, error) {
		pods, err := c.Kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=drained"})
		if err != nil {
			return false, err
		}
		var pod *corev1.Pod
		pod, line = printedLine(ctx, c, pods.Items, h.Name)
		return pod != nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	return line
}

// printedLine finds, among pods, a Ready one not being deleted (on node, unless "") that has
// printed a first line (appendLine's: what its volume holds), and returns it with that line; nil
// when none has yet.
func printedLine(ctx context.Context, c *kube.Clients, pods []corev1.Pod, node string) (*corev1.Pod, string) {
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || !podutils.IsPodReady(p) || node != "" && p.Spec.NodeName != node {
			continue
		}
		logs, err := c.Kube.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			continue // the kubelet serves the log once the container runs
		}
		if first, _, _ := strings.Cut(string(logs), "\n"); first != "" {
			return p, first
		}
	}
	return nil, ""
}

// podNodes names each pod with its node, for a failure message.
func podNodes(pods *corev1.PodList) []string {
	if pods == nil {
		return nil
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Name+" on "+p.Spec.NodeName)
	}
	return out
}

// TestNodeAddPublic first has the private network carry the worker's default route: the first
// join without --private-network or --public stops before anything is recorded, showing the
// --private-network value. Then it joins the worker with --public on a cluster of its own: the nodes reach each
// other at their public addresses (the record, the worker's node address), and the firewalls
// open the peer ports to those addresses only, proven by real connections over the public
// network, from a node and from a host that is none. Then the worker loses its power for good
// and kip node remove --force deregisters it (see forceRemove).
func TestNodeAddPublic(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	own := s.Own(t, publicServer, publicWorker)
	srv, w, outsider := own[0], own[1], s.Lab.Hosts[1]
	e2e.LogK3sOnFailure(t, srv)
	e2e.LogK3sOnFailure(t, w)
	home, kubeconfig, c := longhornServer(ctx, t, s, srv)
	authorize(t, srv, w)

	// The only private network the hosts share carries the worker's default route: on this first
	// join, without --private-network or --public, kip checks it and stops before the join,
	// showing both commands (TestNodeAdd runs the --private-network one, on its second worker).
	defaultRouteVia(ctx, t, w, lab.PrivateGateway)
	r := s.Kip(t, home, "node", "add", w.PublicIP.String(), "--airgap-bundle", s.Bundle, "--yes")
	if want := "the only private network the hosts share, " + lab.PrivatePrefix + ", carries their default route, and the connection checks over it pass: " +
		"to join over it, run kip node add " + w.PublicIP.String() + " --private-network " + lab.PrivatePrefix; r.ExitCode != 1 || !strings.Contains(r.Stderr, want) {
		t.Errorf("first join over a private network that carries the default route: exit %d, want 1 and %q\n%s", r.ExitCode, want, r.Stderr)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || rec.Mode != "" || len(rec.Workers) != 0 {
		t.Errorf("the stopped join recorded %+v (%v)", rec, err)
	}
	defaultRouteVia(ctx, t, w, lab.Gateway)

	p, pause := s.Paused(t, home, nil, "before:longhorn", "node", "add", w.PublicIP.String(), "--public", "--airgap-bundle", s.Bundle, "--yes")
	admin, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := standin.InstallNode(ctx, w, c, admin); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pause); err != nil {
		t.Fatal(err)
	}
	r = p.Wait(t, 10*time.Minute)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Network: public addresses (server "+srv.PublicIP.String()+", node "+w.PublicIP.String()+")") {
		t.Fatalf("join with --public: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	rec, err := cluster.ReadNodes(ctx, c.Dynamic)
	if err != nil {
		t.Fatal(err)
	}
	if wr := rec.Workers[w.Name]; rec.Mode != cluster.ModePublic || wr.Path.Node != w.PublicIP || wr.Path.Server != srv.PublicIP || wr.State != cluster.WorkerReady {
		t.Errorf("nodes record %+v", rec)
	}
	if n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{}); err != nil || nodeAddress(n, corev1.NodeInternalIP) != w.PublicIP.String() {
		t.Errorf("the worker's node: %v", err)
	}
	for _, tc := range []struct {
		from, to *lab.Host
		port     int
		want     bool
	}{{w, srv, 10250, true}, {outsider, srv, 10250, false}, {srv, w, 10250, true}, {outsider, w, 10250, false}, {outsider, w, 22, true}} {
		if got := connects(ctx, t, tc.from, tc.to.PublicIP.String(), tc.port); got != tc.want {
			t.Errorf("public mode %s → %s:%d connects %v, want %v", tc.from.Name, tc.to.Name, tc.port, got, tc.want)
		}
	}
	forceRemove(ctx, t, s, home, c, srv, w)
}

// forceRemove powers the worker off for good (a power cut): once its node is NotReady, a remove
// without --force is refused, naming --force; kip node fence --powered-off fences it once it has
// been NotReady for a minute; with --force kip deregisters it (the node and the
// record gone), takes its address off the server's firewall, and warns that the host still holds
// k3s-agent.
func forceRemove(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w *lab.Host) {
	t.Helper()
	if err := w.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 3*time.Minute, "the powered-off worker NotReady", func(ctx context.Context) (bool, error) {
		n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
		return err == nil && cluster.NodeStatus(n) != cluster.NodeReady, err
	}); err != nil {
		t.Fatal(err)
	}
	r := s.Kip(t, home, "node", "remove", w.Name, "--yes")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "kip cannot reach "+w.Name) || !strings.Contains(r.Stderr, "run kip node remove "+w.Name+" --force") {
		t.Fatalf("remove of a powered-off worker without --force: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	// Fenced first: off a terminal the power-off is confirmed only by --powered-off; the server
	// then finds its kubelet gone.
	notReadyForAMinute(ctx, t, c, w)
	r = s.Kip(t, home, "node", "fence", w.Name, "--yes")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "run kip node fence "+w.Name+" --powered-off") {
		t.Fatalf("fence of a powered-off worker without --powered-off: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	r = s.Kip(t, home, "node", "fence", w.Name, "--powered-off", "--yes")
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Tainted "+w.Name+" out of service") || !strings.Contains(r.Stderr, "Fenced worker "+w.Name) {
		t.Fatalf("fence --powered-off: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	if n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{}); err != nil || cluster.NodeStatus(n) != cluster.NodeOutOfService {
		t.Errorf("the fenced worker's node: %v", err)
	}
	r = s.Kip(t, home, "node", "remove", w.Name, "--force", "--yes")
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, w.Name+" does not answer over SSH") || !strings.Contains(r.Stderr, "k3s-agent is still installed there") {
		t.Fatalf("remove --force of a powered-off worker: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	if _, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node %s after the forced remove: %v", w.Name, err)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || len(rec.Workers) != 0 {
		t.Errorf("nodes record after the forced remove: %+v (%v)", rec, err)
	}
	rules, err := srv.Run(ctx, "ufw status")
	if err != nil || !strings.Contains(rules, "Status: active") || strings.Contains(rules, w.PublicIP.String()) {
		t.Errorf("the server's ufw after the forced remove still names %s (%v):\n%s", w.PublicIP, err, rules)
	}
}

// rerunInstall runs kip install again on the server with the worker joined. With the worker's
// k3s-agent stopped (its node NotReady), the worker's step after the server's finds it not
// Ready on the server's release, checks that the host is the machine kip joined, and starts
// k3s-agent again on that release without a drain: the pod on it is the same pod afterwards.
// Run once more, the step finds the worker Ready on the release and leaves it alone.
func rerunInstall(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w *lab.Host, pod *corev1.Pod) {
	t.Helper()
	n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	release := n.Status.NodeInfo.KubeletVersion
	if _, err := w.Run(ctx, "systemctl stop k3s-agent"); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 2*time.Minute, "the stopped worker NotReady", func(ctx context.Context) (bool, error) {
		n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
		return err == nil && cluster.NodeStatus(n) != cluster.NodeReady, err
	}); err != nil {
		t.Fatal(err)
	}
	install := installArgs(s, srv, s.Bundle, "--storage", "longhorn")
	r := s.Kip(t, home, install...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Workers: k3s "+release+" on "+w.Name+" after the server") ||
		!strings.Contains(r.Stderr, "Worker "+w.Name+" is Ready on k3s "+release) {
		t.Fatalf("install again with the worker's agent stopped: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if p, err := c.Kube.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || p.UID != pod.UID {
		t.Errorf("the pod on the worker after the install: %v", err)
	}
	r = s.Kip(t, home, install...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Worker "+w.Name+" already Ready on k3s "+release) {
		t.Errorf("install again with the worker Ready: exit %d\n%s", r.ExitCode, r.Stderr)
	}

	// kip status runs the host checks on the worker too, over SSH at its recorded address.
	r = s.Kip(t, home, "status", "-o", "json")
	var rep status.Report
	if err := json.Unmarshal([]byte(r.Stdout), &rep); r.ExitCode != 0 || err != nil {
		t.Fatalf("kip status -o json: exit %d, %v\n%s", r.ExitCode, err, r.Stdout)
	}
	for _, node := range []string{srv.Name, w.Name} {
		if !slices.ContainsFunc(rep.HostChecks, func(c status.Check) bool {
			return c.Node == node && c.Name == "certificates" && c.Status == status.StatusOK
		}) {
			t.Errorf("kip status: no passed certificates check on %s in %+v", node, rep.HostChecks)
		}
	}
}

// secondWorker joins a second worker w2 beside w, its default route through the private network
// (as a cloud VPC's), with --private-network. An ufw the operator turned on there stops the join
// before anything changes, even with every port open; once it is off, the join opens the peer
// ports between the two workers on both (real connections, refused from a host that is no node).
// Then w2 is given up while its host still answers: a forced remove is refused until a fence
// holds it stopped, then wipes and deregisters it and closes its peer ports on w and the server.
func secondWorker(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w, w2, outsider *lab.Host) {
	t.Helper()
	authorize(t, srv, w2)
	add := []string{"node", "add", w2.PublicIP.String(), "--airgap-bundle", s.Bundle, "--yes"}
	if _, err := w2.Run(ctx, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ufw && ufw allow 22/tcp && ufw allow 10250/tcp && ufw --force enable"); err != nil {
		t.Fatal(err)
	}
	r := s.Kip(t, home, add...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "ufw is active on "+w2.PublicIP.String()+" and kip does not manage it: a join stops at an unmanaged ufw, even with the ports open") {
		t.Fatalf("join with an unmanaged ufw: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || len(rec.Workers) != 1 {
		t.Errorf("the refused join recorded %+v (%v)", rec, err)
	}
	if _, err := w2.Run(ctx, "ufw --force reset && test ! -e /usr/local/bin/k3s"); err != nil {
		t.Fatalf("turn ufw off on %s, or the refused join installed k3s: %v", w2.Name, err)
	}

	// The private network carries w2's default route, as a cloud VPC's does: the join goes over
	// it as --private-network asks.
	defaultRouteVia(ctx, t, w2, lab.PrivateGateway)
	defer defaultRouteVia(ctx, t, w2, lab.Gateway)
	r = joinWithLonghorn(ctx, t, s, home, c, srv, w2, nil, append(add, "--private-network", lab.PrivatePrefix, "--no-copies")...)
	if want := "Network: private network " + lab.PrivatePrefix + " (server " + srv.PrivateIP.String() + ", node " + w2.PrivateIP.String() + ") (--private-network)"; r.ExitCode != 0 || !strings.Contains(r.Stderr, want) {
		t.Fatalf("join of the second worker, whose default route the private network carries, with --private-network: exit %d, want %q\n%s", r.ExitCode, want, r.Stderr)
	}
	standin.LogOnFailure(t, w2)
	placement(ctx, t, s, home, c, srv, w, w2)
	for _, tc := range []struct {
		from, to *lab.Host
		port     int
		want     bool
	}{{w, w2, 10250, true}, {w2, w, 10250, true}, {w2, srv, 10250, true}, {outsider, w2, 10250, false}, {outsider, w2, 22, true}} {
		if got := connects(ctx, t, tc.from, tc.to.PrivateIP.String(), tc.port); got != tc.want {
			t.Errorf("with two workers %s → %s:%d connects %v, want %v", tc.from.Name, tc.to.Name, tc.port, got, tc.want)
		}
	}

	// Given up while its host still answers: cut off the server's API, it turns NotReady; a
	// forced remove is refused until a fence holds it stopped, then deregisters and wipes it.
	unblock := blockAPI(ctx, t, w2, srv)
	notReadyForAMinute(ctx, t, c, w2)
	forced := []string{"node", "remove", w2.Name, "--force", "--yes"}
	r = s.Kip(t, home, forced...)
	// The worker is cut off from the server but alive: --force without a fence would let
	// Kubernetes hand its volumes to other nodes while it may still write them.
	if want := " and no fence holds it, and --force deletes its node, after which Kubernetes force-deletes its pods"; r.ExitCode != 1 ||
		!strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "fence it first with kip node fence "+w2.Name) {
		t.Errorf("forced remove of the unfenced second worker: exit %d, want 1 and %q\n%s", r.ExitCode, want, r.Stderr)
	}
	if r := s.Kip(t, home, "node", "fence", w2.Name, "--yes"); r.ExitCode != 0 {
		t.Fatalf("fence the second worker: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if r := s.Kip(t, home, forced...); r.ExitCode != 0 || !strings.Contains(r.Stderr, "Wiped k3s from "+w2.Name) {
		t.Fatalf("forced remove of the fenced second worker: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if _, err := c.Kube.CoreV1().Nodes().Get(ctx, w2.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the second worker's node after its forced remove: %v", err)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || len(rec.Workers) != 1 {
		t.Errorf("the workers recorded after the second worker's forced remove: %+v (%v)", rec.Workers, err)
	}
	if out, err := w2.Run(ctx, k3s.AgentGoneCommand()); err != nil {
		t.Errorf("k3s is left on the second worker after its forced remove: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		from, to *lab.Host
		port     int
		want     bool
	}{{w2, w, 10250, false}, {w2, srv, 10250, false}, {srv, w, 10250, true}} {
		if got := connects(ctx, t, tc.from, tc.to.PrivateIP.String(), tc.port); got != tc.want {
			t.Errorf("after the second worker's remove %s → %s:%d connects %v, want %v", tc.from.Name, tc.to.Name, tc.port, got, tc.want)
		}
	}
	if _, err := w2.Run(ctx, sshx.Command("systemctl", "stop", standin.Unit)); err != nil {
		t.Error(err)
	}
	unblock()
}

// placement proves where Longhorn puts copies with two workers, w eligible and w2 joined with
// --no-copies, and the server's disk the least roomy of the three (its reserve raised, so that
// Longhorn, which takes the disk with the most usable storage, would pick a worker first): a
// one-copy volume's copy goes to the server, a two-copy volume's to the server and w, none to
// w2, whose Longhorn node takes no new copies. A one-copy volume of a class without the server's
// tag (as an earlier kip made them) is listed by kip status as not pinned, with the command that
// pins it.
func placement(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w, w2 *lab.Host) {
	t.Helper()
	lhNodes := c.Longhorn.LonghornV1beta2().Nodes("longhorn-system")
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || rec.Workers[w2.Name].Copies != cluster.CopiesUnchecked || rec.Workers[w2.Name].CopiesWhy != "joined with --no-copies" {
		t.Errorf("the second worker's copies after a join with --no-copies: %+v (%v)", rec.Workers[w2.Name], err)
	}
	if n, err := lhNodes.Get(ctx, w2.Name, metav1.GetOptions{}); err != nil || n.Spec.AllowScheduling {
		t.Errorf("the Longhorn node of the worker joined with --no-copies takes new copies: %v", err)
	}
	reserve := func(fraction int64) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := lhNodes.Get(ctx, srv.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for name, d := range n.Spec.Disks {
				st := n.Status.DiskStatus[name]
				if st == nil || st.StorageMaximum == 0 {
					return fmt.Errorf("the server's Longhorn disk %s reports no size yet", name)
				}
				d.StorageReserved = st.StorageMaximum * fraction / 100
				n.Spec.Disks[name] = d
			}
			_, err = lhNodes.Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	reserve(50)
	defer reserve(30) // Longhorn's default reserve, the stand-in's
	if r := s.Kip(t, home, "cluster", "storage", "--max-copies", "2"); r.ExitCode != 0 {
		t.Fatalf("kip cluster storage --max-copies 2: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	var vols []string
	claim := func(name, class string) []string {
		t.Helper()
		pvc := standin.Claim(name, "default", "64Mi")
		pvc.Spec.StorageClassName = &class
		vol, err := standin.CreateClaimOf(ctx, c, pvc)
		if err != nil {
			t.Fatal(err)
		}
		vols = append(vols, vol)
		reps, err := c.Longhorn.LonghornV1beta2().Replicas("longhorn-system").List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + vol})
		if err != nil {
			t.Fatal(err)
		}
		var nodes []string
		for _, r := range reps.Items {
			nodes = append(nodes, r.Spec.NodeID)
		}
		slices.Sort(nodes)
		return nodes
	}
	if got := claim("placed-one", cluster.LonghornOneCopyClass); !slices.Equal(got, []string{srv.Name}) {
		t.Errorf("the one-copy volume's copy is on %v, want the server %s", got, srv.Name)
	}
	want := []string{srv.Name, w.Name}
	slices.Sort(want)
	if got := claim("placed-two", cluster.LonghornTwoCopiesClass); !slices.Equal(got, want) {
		t.Errorf("the two-copy volume's copies are on %v, want %v", got, want)
	}
	pinned := unpinnedOneCopyClass(ctx, t, c)
	claim("placed-loose", cluster.LonghornOneCopyClass)
	pinned()
	r := s.Kip(t, home, "status", "-o", "json")
	var st status.Report
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("kip status -o json: exit %d, %v\n%s", r.ExitCode, err, r.Stderr)
	}
	var loose []string
	for _, u := range st.NotPinned {
		loose = append(loose, u.Claim)
	}
	if !slices.Equal(loose, []string{"placed-loose"}) {
		t.Errorf("kip status lists as not pinned %v, want the claim placed-loose", loose)
	}
	if want := "is not pinned to the server: a rebuild can place it on a worker: running 'kip upgrade' pins it"; !slices.ContainsFunc(st.Warnings, func(w string) bool { return strings.Contains(w, want) }) {
		t.Errorf("kip status warns %q, want %q", st.Warnings, want)
	}
	// Gone again, so that the worker's remove has no copy to move.
	for _, name := range []string{"placed-one", "placed-two", "placed-loose"} {
		if err := c.Kube.CoreV1().PersistentVolumeClaims("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
	if err := poll(ctx, 2*time.Minute, "the placed volumes deleted", func(ctx context.Context) (bool, error) {
		list, err := c.Longhorn.LonghornV1beta2().Volumes("longhorn-system").List(ctx, metav1.ListOptions{})
		return err == nil && !slices.ContainsFunc(list.Items, func(v lh.Volume) bool { return slices.Contains(vols, v.Name) }), err
	}); err != nil {
		t.Fatal(err)
	}
}

// removeWorker takes the worker out again: a pod no controller manages cancels the remove before
// anything changes; the remove drains the worker, moving a Deployment's pod to the server, and
// wipes k3s from it; killed there (its node NotReady now) and run again, it deletes the node and
// closes the server's peer ports to the worker.
// addressMoved records the worker at another lab host's address, as when its address went to
// another machine (here the cluster's server, which the same key logs in to): kip node reboot
// and kip node remove refuse that machine by its name and machine ID and leave it running (its
// boot ID unchanged); the record restored, they act again.
func addressMoved(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, w, other *lab.Host) {
	t.Helper()
	setHost := func(host string) {
		t.Helper()
		if _, err := cluster.UpdateNodes(ctx, c.Dynamic, func(n *cluster.Nodes) error {
			rec := n.Workers[w.Name]
			rec.Host = host
			n.Workers[w.Name] = rec
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	e2e.Run(t, "the worker's address moved to another machine", func(t *testing.T) {
		bootBefore, err := other.Run(ctx, "cat /proc/sys/kernel/random/boot_id")
		if err != nil {
			t.Fatal(err)
		}
		setHost(other.PublicIP.String())
		defer setHost(w.PublicIP.String())
		want := "the host at " + other.PublicIP.String() + " is not worker " + w.Name + ` (it is named "` + other.Name + `"`
		for _, args := range [][]string{{"node", "reboot", w.Name, "--yes"}, {"node", "remove", w.Name, "--yes"}} {
			if r := s.Kip(t, home, args...); r.ExitCode != 1 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "kip leaves it alone") {
				t.Errorf("kip %s with the worker recorded at %s: exit %d, want %q\n%s", strings.Join(args, " "), other.Name, r.ExitCode, want, r.Stderr)
			}
		}
		if bootAfter, err := other.Run(ctx, "cat /proc/sys/kernel/random/boot_id"); err != nil || bootAfter != bootBefore {
			t.Errorf("host %s's boot %q before, %q after (%v)", other.Name, bootBefore, bootAfter, err)
		}
		if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || rec.Workers[w.Name].State != cluster.WorkerReady {
			t.Errorf("the refusals changed the worker's record: %+v (%v)", rec.Workers[w.Name], err)
		}
	})
}

func removeWorker(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, srv, w, outsider *lab.Host) {
	t.Helper()
	remove := []string{"node", "remove", w.Name, "--yes"}
	r := s.Kip(t, home, remove...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "runs pods that no controller manages") || !strings.Contains(r.Stderr, "default/ordinary") {
		t.Fatalf("remove with a bare pod on the worker: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || rec.Workers[w.Name].State != cluster.WorkerReady {
		t.Errorf("the refused remove changed the record: %+v (%v)", rec, err)
	}
	for _, name := range []string{"ordinary", "listener"} {
		if err := c.Kube.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
	// The Deployment keeps its data on a Longhorn volume whose only copy is on the worker (made
	// while the server's Longhorn node allowed no scheduling): the reboot moves that copy.
	longhornScheduling(ctx, t, c, srv, false)
	vol, err := standin.CreateClaim(ctx, c, "drained", "default", "64Mi")
	longhornScheduling(ctx, t, c, srv, true)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := podOn("drained", "", appendLine)
	mountClaim(tmpl, "drained", false)
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyAlways
	tmpl.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
		Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{w.Name}}}},
	}}}}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "drained", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: tmpl.Labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}},
	}
	dep.Spec.Template.Name, dep.Spec.Template.Namespace = "", ""
	if _, err := c.Kube.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runsOn := func(want string) {
		t.Helper()
		if err := poll(ctx, 3*time.Minute, "the Deployment's pod running on "+want, func(ctx context.Context) (bool, error) {
			pods, err := c.Kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=drained"})
			return err == nil && len(pods.Items) == 1 && pods.Items[0].Spec.NodeName == want && pods.Items[0].Status.Phase == corev1.PodRunning, err
		}); err != nil {
			t.Fatal(err)
		}
	}
	runsOn(w.Name)
	addressMoved(ctx, t, s, home, c, w, srv)
	rebootWorker(ctx, t, s, home, c, srv, w, vol)
	// The reboot's drain moved the Deployment's pod to the server: deleted, it starts on the
	// worker again, which it prefers, for the remove's drain to move.
	if err := c.Kube.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=drained"}); err != nil {
		t.Fatal(err)
	}
	runsOn(w.Name)

	// The remove is run again and again, each run killed right after the first write no run
	// before it made, until one finishes; the Deployment's pod then runs on the server.
	start := time.Now()
	var said strings.Builder
	r, writes := s.KillEveryWrite(t, home, nil, func(_ string, r e2e.Result) { said.WriteString(r.Stderr) }, remove...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Remove "+w.PrivateIP.String()+" from your provider's firewall") {
		t.Fatalf("remove, resumed after each write: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	for _, done := range [][2]string{{"Drained " + w.Name, w.Name + " already drained"}, {"Wiped k3s from " + w.Name, "k3s already wiped from " + w.Name}} {
		if all := said.String() + r.Stderr; !strings.Contains(all, done[0]) && !strings.Contains(all, done[1]) {
			t.Errorf("no run of the remove says %q or %q", done[0], done[1])
		}
	}
	t.Logf("measured: kip node remove, killed after each of its %d writes and resumed, took %s", len(writes), time.Since(start).Round(time.Second))
	runsOn(srv.Name)
	if _, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node %s after the remove: %v", w.Name, err)
	}
	if _, err := c.Longhorn.LonghornV1beta2().Nodes("longhorn-system").Get(ctx, w.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Longhorn's node %s after the remove: %v", w.Name, err)
	}
	if rec, err := cluster.ReadNodes(ctx, c.Dynamic); err != nil || len(rec.Workers) != 0 || rec.Mode != cluster.ModePrivate {
		t.Errorf("nodes record after the remove: %+v (%v)", rec, err)
	}
	if _, err := w.Run(ctx, "! systemctl is-active --quiet k3s-agent && test ! -e /var/lib/rancher/k3s && test ! -e /usr/local/bin/k3s && ! pgrep -f '[c]ontainerd-shim'"); err != nil {
		t.Errorf("k3s is still on the removed worker: %v", err)
	}
	// The server's peer ports are closed to the removed worker; its own SSH stays open.
	for _, tc := range []struct {
		from, to *lab.Host
		port     int
		want     bool
	}{{w, srv, 10250, false}, {outsider, w, 22, true}} {
		if got := connects(ctx, t, tc.from, tc.to.PrivateIP.String(), tc.port); got != tc.want {
			t.Errorf("after the remove %s → %s:%d connects %v, want %v", tc.from.Name, tc.to.Name, tc.port, got, tc.want)
		}
	}
	if r := s.Kip(t, home, "node", "list", "-o", "json"); r.ExitCode != 0 || strings.Contains(r.Stdout, w.Name) {
		t.Errorf("kip node list after the remove: exit %d\n%s", r.ExitCode, r.Stdout)
	}
	if err := c.Kube.AppsV1().Deployments("default").Delete(ctx, "drained", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	// Longhorn's node plugin stops with the node's containers; the stand-in's is a host unit.
	if _, err := w.Run(ctx, sshx.Command("systemctl", "stop", standin.Unit)); err != nil {
		t.Error(err)
	}
}

// authorize lets from's root key log in to to, as an operator's key logs in to every node.
func authorize(t *testing.T, from, to *lab.Host) {
	t.Helper()
	key, err := os.ReadFile(from.KeyPath)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(to.Path("/root/.ssh/authorized_keys"), os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(ssh.MarshalAuthorizedKey(signer.PublicKey())); err != nil {
		t.Fatal(err)
	}
}

// connects reports whether a TCP connection from the host reaches addr:port within five seconds.
func connects(ctx context.Context, t *testing.T, from *lab.Host, addr string, port int) bool {
	t.Helper()
	_, err := from.Run(ctx, sshx.Command("timeout", "5", "bash", "-c", `exec 3<>"/dev/tcp/$0/$1"`, addr, fmt.Sprint(port)))
	return err == nil
}

// joinSteps are the steps a first join applies, in order.
// serverMoveKilled runs the join killed right after it wrote the server's new config.yaml in
// the server-network step (the backup and the pending marker written before it), and returns
// config.yaml as it was before: the backup holds it, and the marker names the file.
func serverMoveKilled(ctx context.Context, t *testing.T, s *e2e.Suite, home string, srv *lab.Host, args ...string) string {
	t.Helper()
	run := hostRunner(ctx, t, srv)
	original := run("cat " + k3s.ConfigPath)
	r := s.KipEnv(t, home, []string{fault.KillWriteMatchingEnv + "=" + regexp.QuoteMeta("cat >"+k3s.ConfigPath+".kip-tmp-")}, args...)
	if r.Signal != syscall.SIGKILL {
		t.Fatalf("the join was to be killed right after writing the server's config.yaml: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if got := run("cat " + k3s.ConfigBackupPath); got != original {
		t.Errorf("the backup after the kill:\n%s\nwant config.yaml as it was:\n%s", got, original)
	}
	if got := run("cat " + k3s.PendingPath); got != k3s.ConfigPath+"\n" {
		t.Errorf("the pending marker after the kill: %q", got)
	}
	return original
}

// serverMoved checks the server's config.yaml after its move: the addresses changed in the file
// as it was (everything else kept), its backup the file before the join, no restart pending.
func serverMoved(ctx context.Context, t *testing.T, srv *lab.Host, original string) {
	t.Helper()
	want, err := k3s.SetNodeAddresses([]byte(original), srv.PrivateIP.String(), srv.PublicIP.String())
	if err != nil {
		t.Fatal(err)
	}
	run := hostRunner(ctx, t, srv)
	if got := run("cat " + k3s.ConfigPath); got != string(want) {
		t.Errorf("the server's config.yaml after its move:\n%s\nwant\n%s", got, want)
	}
	if got := run("cat " + k3s.ConfigBackupPath); got != original {
		t.Errorf("the backup after the move:\n%s\nwant config.yaml as it was:\n%s", got, original)
	}
	if got := run("test -e " + k3s.PendingPath + " && echo pending || true"); got != "" {
		t.Errorf("a restart is still pending after the move: %q", got)
	}
}

var joinSteps = []string{"record", "server-network", "server-firewall", "host-packages", "host-modules", "host-sysctls",
	"host-firewall", "host-hardening", "k3s-binary", "k3s-config", "k3s-unit", "k3s-start", "verify", "longhorn", "release", "copies", "recorded"}

// logStep logs what kip node add -v measured of step (its remote commands and time) and returns
// the time.
func logStep(t *testing.T, step, stderr string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`step ` + regexp.QuoteMeta(step) + `: (\d+) remote commands, (\S+)`).FindStringSubmatch(stderr)
	if m == nil {
		t.Errorf("kip node add -v does not measure step %s:\n%s", step, stderr)
		return 0
	}
	d, err := time.ParseDuration(m[2])
	if err != nil {
		t.Error(err)
	}
	t.Logf("measured: step %s: %s remote commands, %s", step, m[1], m[2])
	return d
}

// registryDown runs the join with the cluster registry stopped (Zot's stand-in scaled to no
// pod): the join stops at its checks, naming the registry and the node port it tried; Zot
// running again, the join goes on.
func registryDown(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, w *lab.Host, add func(...string) []string) {
	t.Helper()
	scaleZot := func(n int32) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
		if _, err := c.Kube.AppsV1().Deployments("zot").Patch(ctx, "zot", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := poll(ctx, 2*time.Minute, fmt.Sprintf("Zot with %d ready pods", n), func(ctx context.Context) (bool, error) {
			list, err := c.Kube.DiscoveryV1().EndpointSlices("zot").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=zot"})
			// Every endpoint counts: kube-proxy sends a node port's traffic to a terminating pod
			// while no other is ready.
			var ready, all int
			if err == nil {
				for _, sl := range list.Items {
					for _, e := range sl.Endpoints {
						all++
						if ptr.Deref(e.Conditions.Ready, false) {
							ready++
						}
					}
				}
			}
			return err == nil && ready == int(n) && all == int(n), err
		}); err != nil {
			t.Fatal(err)
		}
	}
	scaleZot(0)
	r := s.Kip(t, home, add()...)
	if want := "the cluster registry does not answer on this node: no answer from Zot at " + w.PrivateIP.String() + ":30500"; r.ExitCode != 1 || !strings.Contains(r.Stderr, want) {
		t.Errorf("join with the cluster registry stopped: exit %d, want 1 and %q\n%s", r.ExitCode, want, r.Stderr)
	}
	scaleZot(1)
}

// blockAPI has h reject its connections to the server's API (6443) on the private network, with
// iptables; the function it returns lifts that again.
func blockAPI(ctx context.Context, t *testing.T, h, srv *lab.Host) func() {
	t.Helper()
	rule := []string{"OUTPUT", "-d", srv.PrivateIP.String(), "-p", "tcp", "--dport", "6443", "-j", "REJECT"}
	if out, err := h.Run(ctx, sshx.Command("iptables", append([]string{"-w", "-I"}, rule...)...)); err != nil {
		t.Fatalf("block 6443 on %s: %v\n%s", h.Name, err, out)
	}
	return func() {
		t.Helper()
		if out, err := h.Run(ctx, sshx.Command("iptables", append([]string{"-w", "-D"}, rule...)...)); err != nil {
			t.Fatalf("unblock 6443 on %s: %v\n%s", h.Name, err, out)
		}
	}
}

// defaultRouteVia points h's default route at gateway: lab.PrivateGateway has the private
// network carry it, lab.Gateway puts it back on the public one. The hosts reach this machine's
// apt proxy and each other on their own links either way.
func defaultRouteVia(ctx context.Context, t *testing.T, h *lab.Host, gateway string) {
	t.Helper()
	if out, err := h.Run(ctx, sshx.Command("ip", "route", "replace", "default", "via", gateway)); err != nil {
		t.Fatalf("default route of %s via %s: %v\n%s", h.Name, gateway, err, out)
	}
}

// heldOff checks the worker between its start and its checks: a resume with other options is
// refused naming them, and an ordinary pod for the worker stays unschedulable under the joining
// taint.
func heldOff(ctx context.Context, t *testing.T, s *e2e.Suite, home string, c *kube.Clients, w *lab.Host, add func(...string) []string) {
	t.Helper()
	r := s.Kip(t, home, add("--no-copies")...)
	if want := "started with other options (--no-copies: started without it, now with it)"; r.ExitCode != 1 || !strings.Contains(r.Stderr, want) {
		t.Errorf("resume with --no-copies: exit %d, want %q\n%s", r.ExitCode, want, r.Stderr)
	}
	n, err := c.Kube.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
	if err != nil || !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cluster.JoiningTaint }) {
		t.Fatalf("the worker before its checks: %v, taints %v", err, n.Spec.Taints)
	}
	ordinary := podOn("ordinary", "", "sleep 3600")
	ordinary.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": w.Name}
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, ordinary, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 2*time.Minute, "the ordinary pod unschedulable", func(ctx context.Context) (bool, error) {
		p, err := c.Kube.CoreV1().Pods("default").Get(ctx, "ordinary", metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		}), err
	}); err != nil {
		t.Fatal(err)
	}
}
