package backup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
)

// RestoreTimeout bounds a restore's wait: Velero's own limit on file-system restores.
const RestoreTimeout = 4 * time.Hour

// RestoreOptions are kip backup restore's.
type RestoreOptions struct {
	Options
	Name string
	// Namespaces are the backup's namespaces to restore (--namespace); all of them when empty.
	Namespaces []string
	// Mapping restores a namespace under another name (--namespace-mapping src:dst,…).
	Mapping map[string]string
	// Prompter asks whether to restore into a namespace that still holds objects, which the
	// restore skips: only what is missing there comes back (a service deleted to restore it).
	Prompter *cli.Prompter
}

// ParseMapping parses --namespace-mapping's src:dst,src2:dst2.
func ParseMapping(s string) (map[string]string, error) {
	m := map[string]string{}
	if s == "" {
		return m, nil
	}
	for _, pair := range strings.Split(s, ",") {
		src, dst, ok := strings.Cut(strings.TrimSpace(pair), ":")
		if !ok || src == "" || dst == "" || strings.Contains(dst, ":") {
			return nil, cli.Usagef("--namespace-mapping %q: want source:target pairs separated by commas, e.g. shop-prod:shop-prod-restored", pair)
		}
		if _, dup := m[src]; dup {
			return nil, cli.Usagef("--namespace-mapping maps %s twice", src)
		}
		m[src] = dst
	}
	return m, nil
}

// Restore restores a backup and waits until Velero finishes. When the namespaces it restores
// into still hold objects of the kinds a service is made of, it restores only with the
// operator's yes (--yes, or on a terminal): a restore skips every object that exists, so it
// leaves those as they are and brings back only what is missing, such as a service deleted to
// restore it from an older backup.
func Restore(ctx context.Context, o *RestoreOptions) error {
	e, s, b, err := loadBackup(ctx, &o.Options, o.Name)
	if err != nil {
		return err
	}
	if err := e.restorable(b, s); err != nil {
		return err
	}
	namespaces, err := restoreNamespaces(b, o.Namespaces, o.Mapping)
	if err != nil {
		return err
	}
	targets := make([]string, len(namespaces))
	for i, ns := range namespaces {
		targets[i] = target(ns, o.Mapping)
	}
	for _, t := range targets {
		if err := e.confirmExisting(ctx, o.Prompter, o.Name, t); err != nil {
			return err
		}
	}
	_, err = e.restore(ctx, b, namespaces, o.Mapping)
	return err
}

// restorable refuses a backup there is nothing sound to restore from (not finished, failed, being
// deleted), and warns about one that is not a completed backup but can still be restored
// (expired, partly failed, missing a volume).
func (e *env) restorable(b *velerov1.Backup, s *Snapshot) error {
	v := s.Verdict(b)
	if why, deleting := beingDeleted(b, s.DBRs); deleting {
		return fmt.Errorf("backup %s cannot be restored: %s", b.Name, why)
	}
	switch b.Status.Phase {
	case velerov1.BackupPhaseCompleted, velerov1.BackupPhasePartiallyFailed:
	default:
		return v.Err(b.Name)
	}
	if v.State != StateCompleted {
		e.o.Printer.Warn(v.Err(b.Name).Error() + "; restoring what it holds")
	}
	return nil
}

// restoreNamespaces checks --namespace and --namespace-mapping against the backup's scope.
func restoreNamespaces(b *velerov1.Backup, want []string, mapping map[string]string) ([]string, error) {
	namespaces := want
	if len(namespaces) == 0 {
		namespaces = b.Spec.IncludedNamespaces
	}
	if len(namespaces) == 0 || slices.Contains(namespaces, "*") {
		return nil, cli.Usagef("backup %s holds every namespace: name the ones to restore with --namespace", b.Name)
	}
	for _, ns := range namespaces {
		if !holds(b, ns) {
			return nil, cli.Usagef("backup %s does not hold namespace %s (it holds %s)", b.Name, ns, strings.Join(b.Spec.IncludedNamespaces, ", "))
		}
	}
	for src, dst := range mapping {
		if !slices.Contains(namespaces, src) {
			return nil, cli.Usagef("--namespace-mapping %s:%s: %s is not among the namespaces restored (%s)", src, dst, src, strings.Join(namespaces, ", "))
		}
	}
	return slices.Sorted(slices.Values(namespaces)), nil
}

func target(ns string, mapping map[string]string) string {
	if t, ok := mapping[ns]; ok {
		return t
	}
	return ns
}

// serviceKinds are the kinds a Kipper service is made of, which refuseExisting looks for. Other
// objects Velero would skip too (the namespace's default ServiceAccount, kube-root-ca.crt) are
// ones every namespace has.
var serviceKinds = []struct {
	gvr  schema.GroupVersionResource
	kind string
}{
	{schema.GroupVersionResource{Group: "kipper.run", Version: "v1alpha1", Resource: "services"}, "service.kipper.run"},
	{schema.GroupVersionResource{Group: "kipper.run", Version: "v1alpha1", Resource: "apps"}, "app.kipper.run"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}, "statefulset"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, "deployment"},
	{schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}, "persistentvolumeclaim"},
	{schema.GroupVersionResource{Version: "v1", Resource: "services"}, "service"},
	{schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, "secret"},
	{schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "configmap"},
}

// maxNamed is how many existing objects a refusal names.
const maxNamed = 8

// confirmExisting asks, when ns holds objects the restore of backup would skip, whether to
// restore only what is missing there; off a terminal without --yes, or answered no, it refuses.
func (e *env) confirmExisting(ctx context.Context, p *cli.Prompter, backup, ns string) error {
	found, err := e.existing(ctx, ns)
	if err != nil || len(found) == 0 {
		return err
	}
	named := found
	if len(named) > maxNamed {
		named = append(slices.Clone(found[:maxNamed]), fmt.Sprintf("and %d more", len(found)-maxNamed))
	}
	skipped := fmt.Sprintf("%s still holds objects that restoring %s skips, because a restore never replaces an object that exists: %s", ns, backup, strings.Join(named, ", "))
	ok, err := p.Confirm("Namespace " + skipped + ". Restore only what is missing there?")
	if errors.Is(err, cli.ErrYesRequired) {
		return fmt.Errorf("namespace %s. To restore only what is missing there (a service you deleted, for one), run the same command with --yes; "+
			"to restore everything, delete them first, or restore beside them with --namespace-mapping <namespace>:%s-restored", skipped, ns)
	}
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("restore cancelled: nothing was changed")
	}
	return nil
}

// existing names the objects in ns, of the kinds a service is made of, that a restore would
// skip; none when ns does not exist.
func (e *env) existing(ctx context.Context, ns string) ([]string, error) {
	if _, err := e.cl.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read namespace %s: %w", ns, err)
	}
	var found []string
	for _, k := range serviceKinds {
		list, err := e.cl.Dynamic.Resource(k.gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			continue // a kind this cluster does not serve
		}
		if err != nil {
			return nil, fmt.Errorf("list %ss in %s: %w", k.kind, ns, err)
		}
		for _, item := range list.Items {
			if !everyNamespaceHas(k.kind, item.GetName(), item.Object) {
				found = append(found, k.kind+" "+item.GetName())
			}
		}
	}
	return found, nil
}

// everyNamespaceHas reports the objects Kubernetes puts in every namespace.
func everyNamespaceHas(kind, name string, obj map[string]any) bool {
	switch kind {
	case "configmap":
		return name == "kube-root-ca.crt"
	case "secret":
		t, _ := obj["type"].(string)
		return t == string(corev1.SecretTypeServiceAccountToken)
	}
	return false
}

// restore restores the namespaces of backup b (under the names mapping gives them), and waits
// until Velero finishes.
func (e *env) restore(ctx context.Context, b *velerov1.Backup, namespaces []string, mapping map[string]string) (*velerov1.Restore, error) {
	return e.restoreSpec(ctx, b, velerov1.RestoreSpec{IncludedNamespaces: namespaces, NamespaceMapping: mapping}, nil)
}

// restoreSpec creates a Restore of backup b with spec and labels, and waits until it finishes.
func (e *env) restoreSpec(ctx context.Context, b *velerov1.Backup, spec velerov1.RestoreSpec, labels map[string]string) (*velerov1.Restore, error) {
	spec.BackupName = b.Name
	r := &velerov1.Restore{
		TypeMeta: metav1.TypeMeta{APIVersion: velerov1.SchemeGroupVersion.String(), Kind: "Restore"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      restoreName(b.Name, e.o.now()),
			Namespace: components.VeleroNamespace,
			Labels:    labels,
		},
		Spec: spec,
	}
	created, err := kube.CreateAs(ctx, e.cl.Dynamic, restoresGVR, components.VeleroNamespace, r)
	if err != nil {
		return nil, veleroErr("create restore", err)
	}
	into := make([]string, len(spec.IncludedNamespaces))
	for i, ns := range spec.IncludedNamespaces {
		into[i] = ns
		if t := target(ns, spec.NamespaceMapping); t != ns {
			into[i] = ns + " as " + t
		}
	}
	p := e.o.Printer
	p.StepStarted(fmt.Sprintf("Restoring %s from backup %s (restore %s)", joinAnd(into), b.Name, created.Name))
	start := time.Now()
	cur, err := e.waitRestore(ctx, created.Name)
	if err != nil {
		p.StepFailed("Restore "+created.Name, err)
		if ctx.Err() != nil {
			return cur, fmt.Errorf("%w (the restore goes on in Velero)", err)
		}
		return cur, err
	}
	if cur.Status.Phase != velerov1.RestorePhaseCompleted {
		err := fmt.Errorf("restore %s of backup %s ended %s with %s and %s%s%s", cur.Name, b.Name, cur.Status.Phase,
			cli.Count(cur.Status.Errors, "error", "errors"), cli.Count(cur.Status.Warnings, "warning", "warnings"), failure(cur), e.volumeFailures(ctx, cur))
		p.StepFailed("Restore "+cur.Name, err)
		return cur, err
	}
	msg := fmt.Sprintf("Restored %s from backup %s", joinAnd(into), b.Name)
	if cur.Status.Warnings > 0 {
		msg += " (" + cli.Count(cur.Status.Warnings, "warning", "warnings") + ")"
	}
	p.StepDone(msg, time.Since(start))
	return cur, nil
}

// restoreEnded reports whether Velero has finished restore r, one way or another.
func restoreEnded(r *velerov1.Restore) bool {
	switch r.Status.Phase {
	case velerov1.RestorePhaseCompleted, velerov1.RestorePhasePartiallyFailed, velerov1.RestorePhaseFailed, velerov1.RestorePhaseFailedValidation:
		return true
	}
	return false
}

// waitRestore waits until Velero has finished the restore named name, and returns it as it
// ended (or as it was last read, with the error).
func (e *env) waitRestore(ctx context.Context, name string) (*velerov1.Restore, error) {
	var cur *velerov1.Restore
	err := kube.Poll(ctx, RestoreTimeout, "restore "+name, func(ctx context.Context) (bool, string, error) {
		got, err := kube.GetAs[velerov1.Restore](ctx, e.cl.Dynamic, restoresGVR, components.VeleroNamespace, name)
		if err != nil {
			return false, "", err
		}
		cur = got
		if restoreEnded(got) {
			return true, "", nil
		}
		pending := "phase " + orNew(string(got.Status.Phase))
		if pr := got.Status.Progress; pr != nil && pr.TotalItems > 0 {
			pending += fmt.Sprintf(", %d of %d items", pr.ItemsRestored, pr.TotalItems)
		}
		return false, pending, nil
	})
	return cur, err
}

// volumeFailures names the volumes whose files restore r failed to restore, with Velero's
// message for each ("" when none failed or they cannot be read).
func (e *env) volumeFailures(ctx context.Context, r *velerov1.Restore) string {
	pvrs, err := kube.ListAs[velerov1.PodVolumeRestore](ctx, e.cl.Dynamic, pvrsGVR, components.VeleroNamespace,
		metav1.ListOptions{LabelSelector: velerov1.RestoreNameLabel + "=" + r.Name})
	if err != nil {
		return ""
	}
	var failed []string
	for _, p := range pvrs {
		if p.Status.Phase == velerov1.PodVolumeRestorePhaseFailed {
			failed = append(failed, fmt.Sprintf("volume %s of pod %s/%s: %s", p.Spec.Volume, p.Spec.Pod.Namespace, p.Spec.Pod.Name, p.Status.Message))
		}
	}
	if len(failed) == 0 {
		return ""
	}
	return "; the files of " + strings.Join(failed, "; ")
}

func failure(r *velerov1.Restore) string {
	var parts []string
	if r.Status.FailureReason != "" {
		parts = append(parts, r.Status.FailureReason)
	}
	parts = append(parts, r.Status.ValidationErrors...)
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, "; ")
}

// restoreName is <backup>-restore-<UTC time>, within Kubernetes' 63-character label limit that
// Velero's restore-name label needs.
func restoreName(backup string, now time.Time) string {
	suffix := "-restore-" + now.UTC().Format("20060102-150405")
	if len(backup)+len(suffix) > 63 {
		backup = strings.TrimRight(backup[:63-len(suffix)], "-")
	}
	return backup + suffix
}
