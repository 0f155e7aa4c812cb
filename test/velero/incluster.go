package velerotest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
)

// NodeAgent is the node agent's DaemonSet, as Velero's chart and `velero install` name it.
const NodeAgent = "node-agent"

// StartInCluster runs Velero the way the chart kip installs runs it, in a cluster whose nodes run
// containers (the lab's): the server is the Deployment velero and the node agent the DaemonSet
// node-agent, both from the images tools/testenv.sh builds into bin/velero/images, which the caller imports on the cluster's nodes
// first. gofakes3 runs on this machine, listening on host, an address the cluster's pods reach
// (the lab's gateway). It returns once the server and every node's agent run and the location is
// Available; at cleanup it stops gofakes3 (the cluster's objects go with its hosts).
func StartInCluster(t testing.TB, cfg *rest.Config, host string) *Server {
	t.Helper()
	bin := findBinaries(t)
	began := time.Now()
	s, err := newServer(bin, cfg)
	if err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("velerotest: logs in %s:\n%s", s.Dir, s.logTails(80))
			t.Logf("velerotest: Velero's pods:\n%s", s.podLogs(60))
		}
		s.stopS3(t)
		_ = os.RemoveAll(s.Dir)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := s.ensureNamespace(ctx); err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	if err := s.startS3(ctx, host); err != nil {
		t.Fatalf("velerotest: %v\n%s", err, s.logTails(30))
	}
	if err := s.bindServerAccount(ctx); err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	if err := s.configure(ctx); err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	if err := s.applyNodeAgent(ctx); err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	cl, err := kube.NewClients(cfg)
	if err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	for kind, name := range map[string]string{"Deployment": Deployment, "DaemonSet": NodeAgent} {
		if err := kube.WaitRollout(ctx, cl, kind, Namespace, name, 4*time.Minute); err != nil {
			t.Fatalf("velerotest: %v", err)
		}
	}
	if err := s.waitLocation(ctx); err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	t.Logf("velerotest: Velero's server and node agents running in the cluster in %s, gofakes3 at %s",
		time.Since(began).Round(time.Millisecond), s.S3URL)
	return s
}

// bindServerAccount gives Velero's service account cluster-admin, as the chart's
// ClusterRoleBinding does: the server and node agent read and write every kind they back up.
func (s *Server) bindServerAccount(ctx context.Context) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ServerServiceAccount},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServerServiceAccount, Namespace: Namespace}},
	}
	if _, err := s.kube.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create cluster role binding %s: %w", crb.Name, err)
	}
	return nil
}

// applyNodeAgent creates the node agent's DaemonSet as Velero's own installer writes it
// (velero's pkg/install/daemonset.go): the kubelet's pod and plugin directories mounted with
// HostToContainer propagation, where it finds each pod's volumes, a scratch directory, and the
// credentials Secret.
func (s *Server) applyNodeAgent(ctx context.Context) error {
	server, err := pinnedImage("velero")
	if err != nil {
		return err
	}
	hostToContainer := corev1.MountPropagationHostToContainer
	credentials := "/credentials/" + CredentialsKey
	labels := map[string]string{"name": NodeAgent, "role": "node-agent"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: NodeAgent, Namespace: Namespace},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"name": NodeAgent}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: ServerServiceAccount,
					SecurityContext:    &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)},
					Containers: []corev1.Container{{
						Name: NodeAgent, Image: server, ImagePullPolicy: corev1.PullIfNotPresent,
						Command: []string{"/velero"}, Args: []string{"node-agent", "server"},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(false)},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "host-pods", MountPath: "/host_pods", MountPropagation: &hostToContainer},
							{Name: "host-plugins", MountPath: "/var/lib/kubelet/plugins", MountPropagation: &hostToContainer},
							{Name: "scratch", MountPath: "/scratch"},
							{Name: "cloud-credentials", MountPath: "/credentials"},
						},
						Env: []corev1.EnvVar{
							{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
							{Name: "VELERO_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
							{Name: "VELERO_SCRATCH_DIR", Value: "/scratch"},
							{Name: "AWS_SHARED_CREDENTIALS_FILE", Value: credentials},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "host-pods", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/pods"}}},
						{Name: "host-plugins", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/plugins"}}},
						{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "cloud-credentials", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: CredentialsSecret}}},
					},
				},
			},
		},
	}
	if _, err := s.kube.AppsV1().DaemonSets(Namespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create daemonset %s: %w", NodeAgent, err)
	}
	return nil
}

// podLogs returns the last n lines of each container of every pod in Velero's namespace.
func (s *Server) podLogs(n int64) string {
	if s.kube == nil {
		return "(no client yet)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := s.kube.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			raw, err := s.kube.CoreV1().Pods(Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: &n}).DoRaw(ctx)
			fmt.Fprintf(&b, "----- pod %s, container %s (%s) -----\n%s%v\n", p.Name, c.Name, p.Status.Phase, raw, err)
		}
	}
	return b.String()
}
