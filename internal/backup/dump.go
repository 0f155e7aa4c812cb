package backup

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// kip service restore-dump checks one Postgres service's backup without a second copy of the
// service: it restores the service's pod from the backup into a scratch namespace with only its
// dump volume's files (Velero restores a pod's volumes through the pod, so a resource modifier
// makes every other volume one Velero skips), runs a scratch Postgres from the service's own
// image beside the dump, loads the newest pg_dump archive into it, and reports its tables and
// rows. Nothing is written in the service's namespace. docs/backups.md has the operator's view.

// Labels of what a restore-dump creates: the scratch namespace, the resource modifier's
// ConfigMap and the Restore name the service (namespace and name) whose dump they restore, so a
// later run finds what an interrupted one left.
const (
	DumpOfNamespaceLabel = "kipper.run/restore-dump-namespace"
	DumpOfServiceLabel   = "kipper.run/restore-dump-service"
)

// Restore-dump limits: the scratch database's container memory, the scratch volume (Postgres's
// data directory) at least DumpScratchMin and DumpScratchFactor times the archive, and the wait
// for the load and the report.
const (
	DumpCheckTimeout  = 2 * time.Hour
	DumpScratchFactor = 8
	DumpScratchMin    = 1 << 30
	dumpMemoryLimit   = "512Mi"
)

// Names inside the scratch pod.
const (
	dumpDBContainer    = "kip-scratch-db"
	dumpCheckContainer = "kip-restore-dump"
	dumpScratchVolume  = "kip-scratch"
	dumpScratchPath    = "/kip-scratch"
	dumpMountPath      = "/dump"
	// dumpNoVolume is the volume a restored claim other than the dump's names: no such volume
	// exists, so nothing is provisioned for it and it stays Pending until its namespace goes.
	dumpNoVolume = "kip-restore-dump-no-volume"
	// restoreWait is the init container Velero adds to a restored pod, which waits until each
	// volume it mounts at /restores/<volume> is restored (velero's pod_volume_restore_action).
	restoreWait = "restore-wait"
	// The scratch database: the user and database Kipper's Postgres services use (spec 002).
	dumpUser     = "kipper"
	dumpDatabase = "app"
)

// dumpScript runs in the check container (the service's image: sh, find, stat, sort, head and
// Postgres's client programs). It picks the newest file on the dump volume that is a pg_dump
// archive (custom format, which starts with PGDMP), waits for the scratch database, loads the
// archive into it and prints the report: "archive MTIME BYTES PATH", then "table SCHEMA NAME
// ROWS" per table (tab-separated), then "done". Exit 3: no archive.
const dumpScript = `set -eu
found=""
find ` + dumpMountPath + ` -type f -exec stat -c '%Y %s %n' {} + | sort -rn > ` + dumpScratchPath + `/files
while read -r mtime size path; do
	if [ "$(head -c 5 "$path")" = PGDMP ]; then found="$mtime $size $path"; break; fi
done < ` + dumpScratchPath + `/files
if [ -z "$found" ]; then
	echo "no-archive $(wc -l < ` + dumpScratchPath + `/files)"
	exit 3
fi
echo "archive $found"
until pg_isready -q -h 127.0.0.1 -U ` + dumpUser + `; do sleep 1; done
pg_restore -h 127.0.0.1 -U ` + dumpUser + ` -d ` + dumpDatabase + ` --no-owner --no-privileges --exit-on-error "${found#* * }"
psql -h 127.0.0.1 -U ` + dumpUser + ` -d ` + dumpDatabase + ` -X -q -A -t -F "$(printf '\t')" -v ON_ERROR_STOP=1 <<'SQL'
SELECT format('SELECT %L, %L, %L, count(*) FROM %I.%I', 'table', schemaname, relname, schemaname, relname)
FROM pg_stat_user_tables ORDER BY schemaname, relname \gexec
SQL
echo done
`

// RestoreDumpOptions are kip service restore-dump's.
type RestoreDumpOptions struct {
	Options
	// Ref names the service; Project and Environment may be empty when the name is unique.
	Ref service.Ref
	// Backup names the backup to restore from; the newest that holds the dump when empty.
	Backup string
}

// DumpReport is what a restore-dump found (-o json).
type DumpReport struct {
	Service   string      `json:"service"`
	Namespace string      `json:"namespace"`
	Backup    string      `json:"backup"`
	Archive   string      `json:"archive"`
	Bytes     int64       `json:"bytes"`
	Written   time.Time   `json:"written"`
	Tables    []DumpTable `json:"tables"`
	Rows      int64       `json:"rows"`
}

// DumpTable is one table of the restored database.
type DumpTable struct {
	Schema string `json:"schema"`
	Name   string `json:"name"`
	Rows   int64  `json:"rows"`
}

// dumpPlan is what a restore-dump restores, from where, into what.
type dumpPlan struct {
	svc     *service.Service
	backup  *velerov1.Backup
	pod     string   // the backed-up pod
	dump    string   // the pod's volume of the dump claim
	others  []string // the pod's other volumes with a file-system backup
	bytes   int64    // the dump volume's size in the backup
	image   string   // the service's image
	inits   []string // the service's own init containers
	scratch string   // the scratch namespace
}

// RestoreDump restores a Postgres service's dump from a backup into a scratch database and
// reports what it holds, then removes the scratch namespace, also when the load fails.
func RestoreDump(ctx context.Context, o *RestoreDumpOptions) error {
	e, err := load(ctx, &o.Options)
	if err != nil {
		return err
	}
	ref, err := service.Find(ctx, e.cl.Dynamic, o.Ref)
	if err != nil {
		return err
	}
	svc, err := service.Get(ctx, e.cl.Dynamic, ref)
	if err != nil {
		return err
	}
	if svc.Type != "postgres" {
		return fmt.Errorf("service %s is a %s service: kip service restore-dump restores a Postgres service's database dump; "+
			"check other services' backups with 'kip backup drill %s' (not on the nano profile) or by restoring onto a recovery cluster", svc.Ref, svc.Type, svc.Namespace())
	}
	plan, err := e.planDump(ctx, svc, o.Backup)
	if err != nil {
		return err
	}
	if err := e.clearDump(ctx, plan); err != nil {
		return err
	}
	rep, runErr := e.runDump(ctx, plan)
	// The scratch namespace goes whatever happened: it holds a copy of the service's dump.
	rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DrillRemoveTimeout)
	defer cancel()
	if err := e.removeDumpScratch(rmCtx, plan); err != nil {
		return errors.Join(runErr, err)
	}
	e.o.Printer.Success("Removed the scratch namespace " + plan.scratch)
	if runErr != nil {
		return runErr
	}
	if o.JSON {
		return cli.WriteJSON(o.Out, rep)
	}
	printDumpReport(e.o.Printer, rep)
	return nil
}

// planDump picks the backup (named, or the newest completed one that holds the service's dump
// volume) and reads what the restore needs from it and from the service's StatefulSet.
func (e *env) planDump(ctx context.Context, svc *service.Service, name string) (*dumpPlan, error) {
	ns := svc.Namespace()
	dumpClaim := Claim{Namespace: ns, Name: svc.DumpClaim()}
	s, err := ReadSnapshot(ctx, e.cl, e.o.now())
	if err != nil {
		return nil, err
	}
	var b *velerov1.Backup
	if name != "" {
		if b, err = s.Find(name); err != nil {
			return nil, err
		}
		if !holds(b, ns) {
			return nil, fmt.Errorf("backup %s does not hold namespace %s (it holds %s)", b.Name, ns, cli.OrNone(strings.Join(b.Spec.IncludedNamespaces, ", ")))
		}
		if err := s.Holds(b, dumpClaim).Err(b.Name); err != nil {
			return nil, fmt.Errorf("%w: name another with --backup, or leave --backup out for the newest that holds it", err)
		}
	} else if b, err = s.LatestHolding([]string{ns}, dumpClaim); err != nil {
		return nil, fmt.Errorf("%w: back the service up with 'kip backup create --namespace %s --wait' first", err, ns)
	}
	own := BackupPVBs(b, s.PVBs)
	dump := findPVB(own, dumpClaim)
	p := &dumpPlan{svc: svc, backup: b, pod: dump.Spec.Pod.Name, dump: dump.Spec.Volume, bytes: dump.Status.Progress.TotalBytes,
		scratch: dumpScratchName(ns, svc.Name)}
	for _, pvb := range own {
		if pvb.Spec.Pod.Namespace == ns && pvb.Spec.Pod.Name == p.pod && pvb.Spec.Volume != p.dump {
			p.others = append(p.others, pvb.Spec.Volume)
		}
	}
	sts, err := e.cl.Kube.AppsV1().StatefulSets(ns).Get(ctx, svc.StatefulSet(), metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the StatefulSet of service %s, whose image the scratch database runs: %w", svc.Ref, err)
	}
	for _, c := range sts.Spec.Template.Spec.Containers {
		if p.image == "" || c.Name == svc.Type {
			p.image = c.Image
		}
	}
	if p.image == "" {
		return nil, fmt.Errorf("the StatefulSet of service %s has no container to take the Postgres image from", svc.Ref)
	}
	for _, c := range sts.Spec.Template.Spec.InitContainers {
		p.inits = append(p.inits, c.Name)
	}
	return p, nil
}

// dumpScratchName is <namespace>-<service>-dump, within the 63 characters of a namespace name.
func dumpScratchName(ns, name string) string {
	n := ns + "-" + name + "-dump"
	if len(n) > 63 {
		n = strings.TrimRight(n[:63], "-")
	}
	return n
}

func (p *dumpPlan) labels() map[string]string {
	return map[string]string{DumpOfNamespaceLabel: p.svc.Namespace(), DumpOfServiceLabel: p.svc.Name}
}

func (p *dumpPlan) selector() string {
	return DumpOfNamespaceLabel + "=" + p.svc.Namespace() + "," + DumpOfServiceLabel + "=" + p.svc.Name
}

// modifierName is the resource modifier ConfigMap's name, in Velero's namespace.
func (p *dumpPlan) modifierName() string { return "kip-restore-dump-" + p.scratch }

// clearDump waits for a restore an interrupted restore-dump of the service started, then removes
// the scratch namespace and resource modifier it left; it refuses a namespace of the scratch
// name that is not one.
func (e *env) clearDump(ctx context.Context, p *dumpPlan) error {
	restores, err := kube.ListAs[velerov1.Restore](ctx, e.cl.Dynamic, restoresGVR, components.VeleroNamespace, metav1.ListOptions{LabelSelector: p.selector()})
	if err != nil {
		return veleroErr("list restores", err)
	}
	for _, r := range restores {
		if restoreEnded(&r) {
			continue
		}
		e.o.Printer.Info("Waiting for restore " + r.Name + ", which an earlier kip service restore-dump of " + p.svc.Name + " started, to end")
		if _, err := e.waitRestore(ctx, r.Name); err != nil {
			return err
		}
	}
	left := false
	got, err := e.cl.Kube.CoreV1().Namespaces().Get(ctx, p.scratch, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("read namespace %s: %w", p.scratch, err)
	case got.Labels[DumpOfNamespaceLabel] != p.svc.Namespace() || got.Labels[DumpOfServiceLabel] != p.svc.Name:
		return fmt.Errorf("namespace %s exists and is not the scratch namespace of a restore-dump of service %s (no labels %s): "+
			"kip service restore-dump restores into it, so rename or remove it first", p.scratch, p.svc.Ref, p.selector())
	default:
		left = true
	}
	_, err = e.cl.Kube.CoreV1().ConfigMaps(components.VeleroNamespace).Get(ctx, p.modifierName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("read the restore's resource modifier %s/%s: %w", components.VeleroNamespace, p.modifierName(), err)
	default:
		left = true
	}
	if !left {
		return nil
	}
	e.o.Printer.Info("Removing the scratch namespace " + p.scratch + " and resource modifier an earlier kip service restore-dump left")
	return e.removeDumpScratch(ctx, p)
}

// removeDumpScratch deletes the resource modifier and the scratch namespace, and waits until the
// namespace is gone.
func (e *env) removeDumpScratch(ctx context.Context, p *dumpPlan) error {
	err := e.cl.Kube.CoreV1().ConfigMaps(components.VeleroNamespace).Delete(ctx, p.modifierName(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the restore's resource modifier %s/%s: %w", components.VeleroNamespace, p.modifierName(), err)
	}
	return e.removeCopy(ctx, p.scratch)
}

// runDump creates the scratch namespace and the resource modifier, restores the service's pod
// into it and waits for the check container's report.
func (e *env) runDump(ctx context.Context, p *dumpPlan) (*DumpReport, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.scratch, Labels: p.labels()}}
	ExcludeFromBackups(ns)
	if _, err := e.cl.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create the scratch namespace %s: %w", p.scratch, err)
	}
	rules, err := p.modifier()
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: p.modifierName(), Namespace: components.VeleroNamespace, Labels: p.labels()},
		Data: map[string]string{"modifiers.yaml": rules}}
	if _, err := e.cl.Kube.CoreV1().ConfigMaps(components.VeleroNamespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create the restore's resource modifier %s/%s: %w", components.VeleroNamespace, cm.Name, err)
	}
	ns0 := p.svc.Namespace()
	e.o.Printer.Info(fmt.Sprintf("Restoring the dump volume of %s (%s in backup %s) into %s, beside a scratch database from the service's image; the service is not touched",
		p.svc.Name, cli.FormatBytes(p.bytes), p.backup.Name, p.scratch))
	spec := velerov1.RestoreSpec{
		IncludedNamespaces: []string{ns0},
		NamespaceMapping:   map[string]string{ns0: p.scratch},
		IncludedResources:  []string{"pods", "persistentvolumeclaims"},
		LabelSelector:      &metav1.LabelSelector{MatchLabels: map[string]string{service.Label: p.svc.Name}},
		ResourceModifier:   &corev1.TypedLocalObjectReference{Kind: "configmap", Name: cm.Name},
	}
	if _, err := e.restoreSpec(ctx, p.backup, spec, p.labels()); err != nil {
		return nil, err
	}
	pr := e.o.Printer
	pr.StepStarted("Loading the newest pg_dump archive of " + p.svc.Name + " into the scratch database")
	start := time.Now()
	rep, err := e.dumpResult(ctx, p)
	if err != nil {
		pr.StepFailed("Load the dump of "+p.svc.Name, err)
		return nil, err
	}
	pr.StepDone(fmt.Sprintf("Loaded %s (%s, written %s) into the scratch database: %s, %s",
		rep.Archive, cli.FormatBytes(rep.Bytes), rep.Written.UTC().Format("2006-01-02 15:04 MST"),
		cli.Count(len(rep.Tables), "table", "tables"), cli.Count(int(rep.Rows), "row", "rows")), time.Since(start))
	return rep, nil
}

// modifier is the resource modifier (Velero's resourceModifierRules, version v1) that makes the
// restored pod a scratch database beside the dump volume. Its volumes become the dump's claim,
// the scratch volume and, for each other volume of the pod with a file-system backup, an empty
// downward-API volume, which Velero does not restore into (podvolume's
// volumeHasNonRestorableSource) and whose mount leaves the restore-wait init container; no other
// volume stays, since the Secrets and ConfigMaps they name are not restored. Its containers
// become the scratch database and the check, the service's own init containers go, and it no
// longer names the StatefulSet that owned it (the garbage collector would delete it) nor its
// service account. The restore leaves persistent volumes out, so Velero neither restores nor
// renames one, nor does it reset the claims it restores with the pod for a new volume: they would
// name the service's own volumes. So every claim names a volume that does not exist, and nothing
// is provisioned for it, except the dump's, which names none and gets a new volume of its class.
func (p *dumpPlan) modifier() (string, error) {
	scratch := resource.NewQuantity(max(DumpScratchMin, DumpScratchFactor*p.bytes), resource.BinarySI)
	volumes := []any{
		map[string]any{"$patch": "replace"},
		map[string]any{"name": dumpScratchVolume, "emptyDir": map[string]any{"sizeLimit": scratch.String()}},
		// Writable: Velero's node agent restores into the pod's volume; the check mounts it
		// read-only.
		map[string]any{"name": p.dump, "persistentVolumeClaim": map[string]any{"claimName": p.svc.DumpClaim()}},
	}
	var restoreMounts []any
	for _, v := range p.others {
		volumes = append(volumes, map[string]any{"name": v, "downwardAPI": map[string]any{"items": []any{}}})
		restoreMounts = append(restoreMounts, map[string]any{"mountPath": "/restores/" + v, "$patch": "delete"})
	}
	inits := []any{map[string]any{"name": restoreWait, "volumeMounts": restoreMounts}}
	for _, n := range p.inits {
		if n != restoreWait {
			inits = append(inits, map[string]any{"name": n, "$patch": "delete"})
		}
	}
	mounts := []any{
		map[string]any{"name": dumpScratchVolume, "mountPath": dumpScratchPath},
		map[string]any{"name": p.dump, "mountPath": dumpMountPath, "readOnly": true},
	}
	resources := map[string]any{"requests": map[string]any{"cpu": "50m", "memory": "64Mi"}, "limits": map[string]any{"memory": dumpMemoryLimit}}
	pod := map[string]any{
		"metadata": map[string]any{"ownerReferences": nil},
		"spec": map[string]any{
			"restartPolicy":                "Never",
			"serviceAccountName":           "default",
			"automountServiceAccountToken": false,
			"volumes":                      volumes,
			"initContainers":               inits,
			"containers": []any{
				map[string]any{"$patch": "replace"},
				map[string]any{
					"name": dumpDBContainer, "image": p.image,
					// The image's own entrypoint (the official image's docker-entrypoint.sh)
					// makes the database and starts it, listening inside the pod only.
					"args": []any{"postgres", "-c", "listen_addresses=127.0.0.1", "-c", "shared_buffers=16MB", "-c", "max_connections=10", "-c", "fsync=off"},
					"env": []any{
						map[string]any{"name": "POSTGRES_USER", "value": dumpUser},
						map[string]any{"name": "POSTGRES_DB", "value": dumpDatabase},
						map[string]any{"name": "POSTGRES_HOST_AUTH_METHOD", "value": "trust"},
						map[string]any{"name": "PGDATA", "value": dumpScratchPath + "/pgdata"},
					},
					"volumeMounts": mounts[:1], "resources": resources,
				},
				map[string]any{
					"name": dumpCheckContainer, "image": p.image,
					"command": []any{"sh", "-c", dumpScript}, "volumeMounts": mounts,
					"resources": map[string]any{"requests": map[string]any{"cpu": "10m", "memory": "32Mi"}, "limits": map[string]any{"memory": "256Mi"}},
				},
			},
		},
	}
	podPatch, err := json.Marshal(pod)
	if err != nil {
		return "", err
	}
	// Velero matches each rule against the object as the backup holds it (its namespace the
	// service's) and applies the patches of every rule that matches, in order: every claim names
	// no volume, then the dump's names none at all.
	ns := []any{p.svc.Namespace()}
	rules := []any{
		map[string]any{
			"conditions":       map[string]any{"groupResource": "pods", "namespaces": ns, "resourceNameRegex": "^" + regexp.QuoteMeta(p.pod) + "$"},
			"strategicPatches": []any{map[string]any{"patchData": string(podPatch)}},
		},
		map[string]any{
			"conditions":   map[string]any{"groupResource": "persistentvolumeclaims", "namespaces": ns},
			"mergePatches": []any{map[string]any{"patchData": `{"spec":{"volumeName":"` + dumpNoVolume + `"}}`}},
		},
		map[string]any{
			"conditions":   map[string]any{"groupResource": "persistentvolumeclaims", "namespaces": ns, "resourceNameRegex": "^" + regexp.QuoteMeta(p.svc.DumpClaim()) + "$"},
			"mergePatches": []any{map[string]any{"patchData": `{"spec":{"volumeName":null}}`}},
		},
	}
	out, err := yaml.Marshal(map[string]any{"version": "v1", "resourceModifierRules": rules})
	return string(out), err
}

// dumpResult waits until the check container of the restored pod ends, and reads its report.
func (e *env) dumpResult(ctx context.Context, p *dumpPlan) (*DumpReport, error) {
	pods := e.cl.Kube.CoreV1().Pods(p.scratch)
	var ended *corev1.ContainerStateTerminated
	err := kube.Poll(ctx, DumpCheckTimeout, "the load of the dump in "+p.scratch, func(ctx context.Context) (bool, string, error) {
		pod, err := pods.Get(ctx, p.pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "", fmt.Errorf("the restore left no pod %s in %s: 'kip backup describe %s' shows what the backup holds", p.pod, p.scratch, p.backup.Name)
		}
		if err != nil {
			return false, "", err
		}
		for _, st := range pod.Status.ContainerStatuses {
			if st.Name == dumpDBContainer && st.State.Terminated != nil {
				return false, "", fmt.Errorf("the scratch database ended (exit code %d, %s) before the load: kubectl -n %s logs %s -c %s",
					st.State.Terminated.ExitCode, st.State.Terminated.Reason, p.scratch, p.pod, dumpDBContainer)
			}
			if st.Name == dumpCheckContainer && st.State.Terminated != nil {
				ended = st.State.Terminated
				return true, "", nil
			}
		}
		if pod.Status.Phase == corev1.PodFailed {
			return false, "", fmt.Errorf("pod %s/%s failed: %s %s", p.scratch, p.pod, pod.Status.Reason, pod.Status.Message)
		}
		return false, podWaiting(pod), nil
	})
	if err != nil {
		return nil, err
	}
	log, err := pods.GetLogs(p.pod, &corev1.PodLogOptions{Container: dumpCheckContainer, LimitBytes: ptr.To[int64](4 << 20)}).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the report of the load (container %s of pod %s/%s): %w", dumpCheckContainer, p.scratch, p.pod, err)
	}
	rep, err := parseDumpReport(string(log), ended.ExitCode)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", p.backup.Name, err)
	}
	rep.Service, rep.Namespace, rep.Backup = p.svc.Name, p.svc.Namespace(), p.backup.Name
	return rep, nil
}

// podWaiting says what a pod waits for: its conditions' and containers' reasons.
func podWaiting(pod *corev1.Pod) string {
	var why []string
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			why = append(why, c.Message)
		}
	}
	for _, st := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		if w := st.State.Waiting; w != nil && w.Reason != "" {
			why = append(why, st.Name+": "+w.Reason)
		}
	}
	if len(why) == 0 {
		return "pod " + pod.Name + " " + string(pod.Status.Phase)
	}
	return "pod " + pod.Name + ": " + strings.Join(why, "; ")
}

// parseDumpReport reads the check container's log (dumpScript's lines) as it ended with code.
func parseDumpReport(log string, code int32) (*DumpReport, error) {
	rep := &DumpReport{Tables: []DumpTable{}}
	var done bool
	var other []string
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch f := strings.Split(line, "\t"); {
		case strings.HasPrefix(line, "no-archive "):
			return nil, fmt.Errorf("its dump volume holds no pg_dump archive (of %s on it, none starts as pg_dump -Fc's archives do)", cli.Count(atoi(strings.TrimPrefix(line, "no-archive ")), "file", "files"))
		case strings.HasPrefix(line, "archive "):
			parts := strings.SplitN(strings.TrimPrefix(line, "archive "), " ", 3)
			if len(parts) != 3 {
				return nil, fmt.Errorf("the load's report: unreadable line %q", line)
			}
			mtime, err1 := strconv.ParseInt(parts[0], 10, 64)
			size, err2 := strconv.ParseInt(parts[1], 10, 64)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("the load's report: line %q: %w", line, err)
			}
			rep.Archive, rep.Bytes, rep.Written = strings.TrimPrefix(parts[2], dumpMountPath+"/"), size, time.Unix(mtime, 0).UTC()
		case len(f) == 4 && f[0] == "table":
			n, err := strconv.ParseInt(f[3], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("the load's report: line %q: %w", line, err)
			}
			rep.Tables = append(rep.Tables, DumpTable{Schema: f[1], Name: f[2], Rows: n})
			rep.Rows += n
		case line == "done":
			done = true
		default:
			other = append(other, line)
		}
	}
	if done && code == 0 && rep.Archive != "" {
		return rep, nil
	}
	what := "the load of the dump failed"
	if rep.Archive != "" {
		what = "loading " + rep.Archive + " into a scratch database failed"
	}
	if len(other) > 5 {
		other = other[len(other)-5:]
	}
	return nil, fmt.Errorf("%s (exit code %d): %s", what, code, cli.OrNone(strings.Join(other, "; ")))
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}

// printDumpReport prints the tables of a restored dump.
func printDumpReport(p *cli.Printer, rep *DumpReport) {
	p.Success(fmt.Sprintf("The dump of %s in backup %s restores: %s in %s, %s", rep.Service, rep.Backup, rep.Archive,
		cli.Count(len(rep.Tables), "table", "tables"), cli.Count(int(rep.Rows), "row", "rows")))
	for _, t := range rep.Tables {
		p.Info(fmt.Sprintf("  %s.%s: %s", t.Schema, t.Name, cli.Count(int(t.Rows), "row", "rows")))
	}
}
