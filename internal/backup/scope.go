package backup

import (
	"context"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
)

// The scope of kip backup create: the namespaces of one project (--project), the namespaces
// named (--namespace), or by default every Kipper project's namespaces. A project's namespaces
// are the ones its Project object lists (status.namespaces, one per environment).

// ProjectNamespaces returns project's namespaces, or every project's when project is "".
func ProjectNamespaces(ctx context.Context, cl *kube.Clients, project string) ([]string, error) {
	list, err := cl.Dynamic.Resource(projectsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Kipper projects: %w", err)
	}
	var names, out []string
	for _, p := range list.Items {
		names = append(names, p.GetName())
		if project != "" && p.GetName() != project {
			continue
		}
		out = append(out, projectNamespaces(&p)...)
	}
	sort.Strings(names)
	if project != "" && !slices.Contains(names, project) {
		return nil, fmt.Errorf("no Kipper project %q on this cluster (projects: %s)", project, cli.OrNone(strings.Join(names, ", ")))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func projectNamespaces(p *unstructured.Unstructured) []string {
	ns, _, _ := unstructured.NestedStringSlice(p.Object, "status", "namespaces")
	return ns
}

// Scope is what one kip backup create covers.
type Scope struct {
	// Project is --project, "" otherwise.
	Project string `json:"project,omitempty"`
	// Namespaces are the namespaces the backup holds, sorted.
	Namespaces []string `json:"namespaces"`
}

// resolveScope turns create's flags into namespaces that exist.
func resolveScope(ctx context.Context, cl *kube.Clients, project string, namespaces []string) (Scope, error) {
	s := Scope{Project: project}
	switch {
	case len(namespaces) > 0:
		s.Namespaces = slices.Compact(slices.Sorted(slices.Values(namespaces)))
	default:
		ns, err := ProjectNamespaces(ctx, cl, project)
		if err != nil {
			return s, err
		}
		if len(ns) == 0 {
			if project != "" {
				return s, fmt.Errorf("project %s has no namespaces yet: nothing to back up", project)
			}
			return s, fmt.Errorf("no Kipper project on this cluster has a namespace: nothing to back up; name other namespaces with --namespace")
		}
		s.Namespaces = ns
	}
	list, err := cl.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return s, fmt.Errorf("list namespaces: %w", err)
	}
	exist := map[string]bool{}
	for _, ns := range list.Items {
		exist[ns.Name] = true
	}
	var missing []string
	for _, n := range s.Namespaces {
		if !exist[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return s, fmt.Errorf("namespace %s does not exist", strings.Join(missing, ", "))
	}
	return s, nil
}

// holds reports whether backup b's scope includes namespace ns (Velero's rules: no included
// namespaces or "*" means all; from 1.18 entries may be globs).
func holds(b *velerov1.Backup, ns string) bool {
	match := func(patterns []string) bool {
		for _, p := range patterns {
			if ok, _ := path.Match(p, ns); ok || p == ns {
				return true
			}
		}
		return false
	}
	inc := b.Spec.IncludedNamespaces
	return (len(inc) == 0 || match(inc)) && !match(b.Spec.ExcludedNamespaces)
}

func holdsAll(b *velerov1.Backup, namespaces []string) bool {
	for _, ns := range namespaces {
		if !holds(b, ns) {
			return false
		}
	}
	return true
}

// Excluded reports whether Velero leaves obj out of every backup: its exclude-from-backup label
// is exactly "true".
func Excluded(obj metav1.Object) bool {
	return obj.GetLabels()[velerov1.ExcludeFromBackupLabel] == "true"
}

// ExcludeFromBackups labels obj so that Velero leaves it out of every backup. A pod's label does
// not exclude its claim or volume: the copy pods of storage moves label all three.
func ExcludeFromBackups(obj metav1.Object) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[velerov1.ExcludeFromBackupLabel] = "true"
	obj.SetLabels(labels)
}

// census is the claims in scope whose data a backup should hold — every bound claim that is not
// excluded and whose volume Velero can back up — and why Velero will hold no data for some of them
// (a claim no running pod mounts in a container), which keeps the backup from being a completed
// one; and the claims Velero cannot back up at all (hostPath volumes), which are not counted.
type census struct {
	Claims      []Claim
	Skipped     []string
	Unsupported []string
}

// takeCensus reads the volumes, pods and claims of the cluster, one list of each whatever the
// number of namespaces, and takes those of namespaces.
func takeCensus(ctx context.Context, cl *kube.Clients, namespaces []string) (census, error) {
	var c census
	core := cl.Kube.CoreV1()
	pvs, err := core.PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return c, fmt.Errorf("list volumes: %w", err)
	}
	pods, err := core.Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return c, fmt.Errorf("list pods: %w", err)
	}
	pvcs, err := core.PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return c, fmt.Errorf("list claims: %w", err)
	}
	hostPath := map[string]bool{}
	for _, pv := range pvs.Items {
		hostPath[pv.Name] = pv.Spec.HostPath != nil
	}
	// For each claim ("ns/name"): whether a running pod mounts it, the pods that would but are not
	// running, and whether a pod leaves it out of file-system backups by annotation.
	running, optedOut := map[string]bool{}, map[string]bool{}
	waiting := map[string][]string{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !slices.Contains(namespaces, pod.Namespace) || Excluded(pod) || pod.DeletionTimestamp != nil {
			continue
		}
		mounted, excluded := podClaims(pod)
		for _, claim := range excluded {
			optedOut[pod.Namespace+"/"+claim] = true
		}
		for _, claim := range mounted {
			key := pod.Namespace + "/" + claim
			if pod.Status.Phase == corev1.PodRunning {
				running[key] = true
			} else if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
				waiting[key] = append(waiting[key], fmt.Sprintf("%s (%s)", pod.Name, orPending(string(pod.Status.Phase))))
			}
		}
	}
	for _, pvc := range pvcs.Items {
		key := pvc.Namespace + "/" + pvc.Name
		if !slices.Contains(namespaces, pvc.Namespace) || Excluded(&pvc) || optedOut[key] || pvc.Status.Phase != corev1.ClaimBound {
			continue // out of scope, left out, or holding no data yet
		}
		if hostPath[pvc.Spec.VolumeName] {
			c.Unsupported = append(c.Unsupported, key)
			continue
		}
		c.Claims = append(c.Claims, Claim{Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID)})
		switch {
		case running[key]:
		case len(waiting[key]) > 0:
			c.Skipped = append(c.Skipped, fmt.Sprintf("pod %s/%s mounts claim %s", pvc.Namespace, strings.Join(waiting[key], ", "), pvc.Name))
		default:
			c.Skipped = append(c.Skipped, fmt.Sprintf("no running pod mounts claim %s (Velero backs a volume's files up only through a running pod that mounts it)", key))
		}
	}
	return c, nil
}

// podClaims are the claims pod mounts in a container, which file-system backups read, and those
// its backup.velero.io/backup-volumes-excludes annotation leaves out.
func podClaims(pod *corev1.Pod) (mounted, excluded []string) {
	inContainer := map[string]bool{}
	for _, ctr := range pod.Spec.Containers {
		for _, m := range ctr.VolumeMounts {
			inContainer[m.Name] = true
		}
	}
	optOut := strings.Split(pod.Annotations[velerov1.VolumesToExcludeAnnotation], ",")
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim == nil:
		case slices.Contains(optOut, v.Name):
			excluded = append(excluded, v.PersistentVolumeClaim.ClaimName)
		case inContainer[v.Name]:
			mounted = append(mounted, v.PersistentVolumeClaim.ClaimName)
		}
	}
	return mounted, excluded
}

func orPending(phase string) string {
	if phase == "" {
		return "Pending"
	}
	return phase
}

// joinAnd is "a", "a and b", "a, b and c".
func joinAnd(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}
