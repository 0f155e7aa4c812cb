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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	var missing []string
	for _, n := range s.Namespaces {
		if _, err := cl.Kube.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			missing = append(missing, n)
		} else if err != nil {
			return s, fmt.Errorf("read namespace %s: %w", n, err)
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

// census is the claims in scope that a backup should hold (mounted by a pod, not excluded),
// and the pods whose volumes Velero will skip because they are not Running.
type census struct {
	Claims  []Claim
	Skipped []string // "pod ns/name (Pending) mounts claim c"
}

// takeCensus reads the pods and claims of namespaces: one list of each per namespace.
func takeCensus(ctx context.Context, cl *kube.Clients, namespaces []string) (census, error) {
	var c census
	seen := map[string]bool{}
	for _, ns := range namespaces {
		pods, err := cl.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return c, fmt.Errorf("list pods in %s: %w", ns, err)
		}
		pvcs, err := cl.Kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return c, fmt.Errorf("list claims in %s: %w", ns, err)
		}
		byName := map[string]*corev1.PersistentVolumeClaim{}
		for i := range pvcs.Items {
			byName[pvcs.Items[i].Name] = &pvcs.Items[i]
		}
		for i := range pods.Items {
			pod := &pods.Items[i]
			if Excluded(pod) || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				continue
			}
			for _, v := range podClaims(pod) {
				pvc := byName[v]
				if pvc == nil || Excluded(pvc) || seen[ns+"/"+v] {
					continue
				}
				if pod.Status.Phase != corev1.PodRunning {
					c.Skipped = append(c.Skipped, fmt.Sprintf("pod %s/%s (%s) mounts claim %s", ns, pod.Name, orPending(string(pod.Status.Phase)), v))
				}
				seen[ns+"/"+v] = true
				c.Claims = append(c.Claims, Claim{Namespace: ns, Name: v, UID: string(pvc.UID)})
			}
		}
	}
	return c, nil
}

// podClaims are the claims pod mounts in a container, the ones file-system backups can read.
func podClaims(pod *corev1.Pod) []string {
	mounted := map[string]bool{}
	for _, ctr := range pod.Spec.Containers {
		for _, m := range ctr.VolumeMounts {
			mounted[m.Name] = true
		}
	}
	var out []string
	excluded := strings.Split(pod.Annotations[velerov1.VolumesToExcludeAnnotation], ",")
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim == nil || !mounted[v.Name] || slices.Contains(excluded, v.Name) {
			continue
		}
		out = append(out, v.PersistentVolumeClaim.ClaimName)
	}
	return out
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
