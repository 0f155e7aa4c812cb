package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/lab"
)

// busybox is k3s's own mirror of busybox, which lab hosts import from their airgap images as
// every k3s server has it (test/images builds it from Debian's static busybox).
const busybox = "rancher/mirrored-library-busybox:1.37.0"

// localPathDir is where k3s's local-path provisioner keeps a claim's directory on its node.
const localPathDir = "/var/lib/rancher/k3s/storage"

// podOn returns a Pod pinned to node running script in busybox.
func podOn(name, node, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: "main", Image: busybox, Command: []string{"sh", "-c", script}}},
		},
	}
}

// waitPod waits until the Pod's phase is want, failing early when it ends otherwise.
func waitPod(ctx context.Context, t *testing.T, c *kube.Clients, name string, want corev1.PodPhase, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := poll(ctx, timeout, "pod "+name+" "+string(want), func(ctx context.Context) (bool, error) {
		p, err := c.Kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		if p.Status.Phase == want {
			return true, nil
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s is %s: %s", name, p.Status.Phase, podLog(ctx, c, name))
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func podLog(ctx context.Context, c *kube.Clients, name string) string {
	b, err := c.Kube.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(b))
}

func deletePod(ctx context.Context, t *testing.T, c *kube.Clients, name string) {
	t.Helper()
	err := c.Kube.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := poll(ctx, time.Minute, "pod "+name+" gone", func(ctx context.Context) (bool, error) {
		_, err := c.Kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// testLocalPath has a Pod on each host write a file into a local-path claim: the file is on that
// host's disk at the provisioner's path with the Pod's owner and mode. Deleting a claim removes
// its directory (reclaim Delete); a claim whose volume was first set to Retain keeps it.
func testLocalPath(ctx context.Context, t *testing.T, c *kube.Clients, hosts []*lab.Host) {
	for i, h := range hosts {
		claim := fmt.Sprintf("data-%s", h.Name)
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: "default"},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: ptr.To("local-path"),
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}},
			},
		}
		if _, err := c.Kube.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		uid := int64(2000 + i)
		pod := podOn("writer-"+h.Name, "", "echo written on "+h.Name+" > /data/file && chmod 640 /data/file")
		// The scheduler places it, to the node its node selector names, so that the claim is
		// provisioned there (WaitForFirstConsumer).
		pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: h.Name}
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To(uid), RunAsGroup: ptr.To(uid)}
		pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(ctx, t, c, pod.Name, corev1.PodSucceeded, 3*time.Minute)
		bound, err := c.Kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(localPathDir, bound.Spec.VolumeName+"_default_"+claim)
		out, err := h.Run(ctx, sshx.Command("stat", "-c", "%u %g %a", dir+"/file")+" && "+sshx.Command("cat", dir+"/file"))
		if err != nil {
			t.Fatalf("the claim's file on %s: %v", h.Name, err)
		}
		if want := fmt.Sprintf("%d %d 640\nwritten on %s", uid, uid, h.Name); strings.TrimSpace(out) != want {
			t.Fatalf("the claim's file on %s's disk: %q, want %q", h.Name, out, want)
		}
		deletePod(ctx, t, c, pod.Name)

		retain := i == len(hosts)-1 // the last host's claim keeps its data
		if retain {
			patch := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`)
			if _, err := c.Kube.CoreV1().PersistentVolumes().Patch(ctx, bound.Spec.VolumeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Kube.CoreV1().PersistentVolumeClaims("default").Delete(ctx, claim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if retain {
			if err := poll(ctx, time.Minute, "volume "+bound.Spec.VolumeName+" released", func(ctx context.Context) (bool, error) {
				pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, bound.Spec.VolumeName, metav1.GetOptions{})
				return err == nil && pv.Status.Phase == corev1.VolumeReleased, err
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Run(ctx, sshx.Command("test", "-f", dir+"/file")); err != nil {
				t.Fatalf("a retained volume's directory is gone from %s: %v", h.Name, err)
			}
			continue
		}
		if err := poll(ctx, 2*time.Minute, "claim "+claim+"'s directory removed from "+h.Name, func(ctx context.Context) (bool, error) {
			_, err := h.Run(ctx, sshx.Command("test", "!", "-e", dir))
			return err == nil, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// testPodNetwork has a Pod on an agent reach a web server Pod on the server by its IP and by
// its Service's name through cluster DNS, with kubectl exec, and reads the server's log.
func testPodNetwork(ctx context.Context, t *testing.T, c *kube.Clients, server, agent *lab.Host) {
	web := podOn("web", server.Name, "mkdir -p /tmp/www && echo served by "+server.Name+" > /tmp/www/index.html && exec httpd -f -v -p 8080 -h /tmp/www")
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := c.Kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := podOn("client", agent.Name, "exec sleep 3600")
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, client, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	webPod := waitPod(ctx, t, c, "web", corev1.PodRunning, 3*time.Minute)
	clientPod := waitPod(ctx, t, c, "client", corev1.PodRunning, 3*time.Minute)
	if !strings.HasPrefix(webPod.Status.PodIP, "10.42.") || !strings.HasPrefix(clientPod.Status.PodIP, "10.42.") || webPod.Status.PodIP[:8] == clientPod.Status.PodIP[:8] {
		t.Fatalf("pod IPs %s (server) and %s (agent): want addresses of two nodes' 10.42.x.0/24", webPod.Status.PodIP, clientPod.Status.PodIP)
	}
	for _, url := range []string{"http://" + webPod.Status.PodIP + ":8080/", "http://web.default.svc.cluster.local/"} {
		var out string
		// The Service's endpoints and the DNS record follow the Pod's readiness within seconds.
		err := poll(ctx, time.Minute, "the agent's pod fetching "+url, func(ctx context.Context) (bool, error) {
			var err error
			out, err = server.Run(ctx, sshx.Command("k3s", "kubectl", "exec", "-n", "default", "client", "--", "timeout", "5", "wget", "-q", "-O-", url))
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("%v (last output %q)", err, out)
		}
		if strings.TrimSpace(out) != "served by "+server.Name {
			t.Fatalf("%s from the agent's pod: %q", url, out)
		}
	}
	if log := podLog(ctx, c, "web"); !strings.Contains(log, clientPod.Status.PodIP) {
		t.Errorf("the web pod's log does not name the client %s:\n%s", clientPod.Status.PodIP, log)
	}
}

// containerRunning reports whether a process of this machine has marker in its command line:
// the lab's containers are processes of this machine's kernel.
func containerRunning(marker string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), marker) {
			return true
		}
	}
	return false
}

// poll waits as kube.Poll does for a condition that names nothing pending.
func poll(ctx context.Context, timeout time.Duration, what string, fn func(context.Context) (bool, error)) error {
	return kube.Poll(ctx, timeout, what, func(ctx context.Context) (bool, string, error) {
		ok, err := fn(ctx)
		return ok, "", err
	})
}
