package upgrade

import (
	"context"
	"fmt"
	"slices"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// unmountedVolumes is spec 002's check before a Longhorn step's backup: Velero's file backup
// reads a volume through a regular container of a running pod that mounts it, so every claim
// in the backup's scope (every project's namespaces, as kip backup create's) must be mounted
// so, or its data is not in the backup. Each one that is not is named with what starts its
// user: a stopped app (kip app start), a stopped service (kip service start, also after kip
// node fence stopped it), else mount it or remove it.
func unmountedVolumes(ctx context.Context, cl *kube.Clients) ([]string, error) {
	namespaces, err := backup.ProjectNamespaces(ctx, cl, "")
	if err != nil {
		return nil, err
	}
	services, err := service.List(ctx, cl.Dynamic, cl.Kube)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ns := range namespaces {
		claims, err := cl.Kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list the volume claims of %s: %w", ns, err)
		}
		pods, err := cl.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list the pods of %s: %w", ns, err)
		}
		mounted := mountedClaims(pods.Items)
		var unmounted []string
		for _, c := range claims.Items {
			if !mounted[c.Name] {
				unmounted = append(unmounted, c.Name)
			}
		}
		if len(unmounted) == 0 {
			continue
		}
		sort.Strings(unmounted)
		deployments, err := cl.Kube.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list the Deployments of %s: %w", ns, err)
		}
		for _, claim := range unmounted {
			what := fmt.Sprintf("volume %s in %s is mounted by no running pod, so a backup would not hold its data", claim, ns)
			out = append(out, what+": "+startUser(ctx, cl, ns, claim, services, deployments.Items))
		}
	}
	return out, nil
}

// mountedClaims are the claims a regular container of a running pod mounts.
func mountedClaims(pods []corev1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, p := range pods {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			if slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool {
				return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name })
			}) {
				out[v.PersistentVolumeClaim.ClaimName] = true
			}
		}
	}
	return out
}

// startUser says what starts the user of an unmounted claim in ns.
func startUser(ctx context.Context, cl *kube.Clients, ns, claim string, services []*service.Service, deployments []appsv1.Deployment) string {
	for _, s := range services {
		if s.Namespace() != ns || (s.DataClaim() != claim && s.DumpClaim() != claim) {
			continue
		}
		if s.FenceStop != "" {
			return fmt.Sprintf("kip node fence stopped service %s (worker %s): start it with 'kip service start %s', or remove the volume", s.Name, s.FenceStop, s.Flags())
		}
		return fmt.Sprintf("service %s is stopped: start it with 'kip service start %s', or remove the volume", s.Name, s.Flags())
	}
	for _, d := range deployments {
		if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
			return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim
		}) {
			continue
		}
		ref, ok := projectOf(ctx, cl, ns, d.Name)
		if !ok {
			break
		}
		if a, err := app.Get(ctx, cl.Dynamic, ref); err == nil && a.Stopped() {
			return fmt.Sprintf("app %s is stopped: start it with 'kip app start %s', or remove the volume", a.Name, a.Flags())
		}
	}
	return "mount it in a running pod, or remove it"
}

// projectOf names name in namespace ns by the project whose namespace it is.
func projectOf(ctx context.Context, cl *kube.Clients, ns, name string) (service.Ref, bool) {
	n, err := cl.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil || n.Labels[service.ProjectLabel] == "" {
		return service.Ref{}, false
	}
	return service.RefIn(n.Labels[service.ProjectLabel], ns, name), true
}
