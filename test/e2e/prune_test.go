package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/clock"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/move"
	"kipper.run/kip/internal/prune"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/status"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/longhorn-standin/standin"
	"kipper.run/kip/test/testenv"
	velerotest "kipper.run/kip/test/velero"
)

// pruneArgs runs kip cluster storage prune with the lab host's SSH key.
func (l *moveLab) pruneArgs(extra ...string) []string {
	return append([]string{"cluster", "storage", "prune"}, extra...)
}

// keptCopy is the local directory of service ref's kept copy, and its volume.
func (l *moveLab) keptCopy(ctx context.Context, t *testing.T, ref service.Ref) (dir, volume string) {
	t.Helper()
	pvs, err := l.c.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var moved []string
	for _, pv := range pvs.Items {
		if pv.Annotations[move.MovedToAnnotation] == "" {
			continue
		}
		dir, _ := service.LocalPath(&pv)
		moved = append(moved, fmt.Sprintf("%s (claim %v, directory %q, annotations %v)", pv.Name, pv.Spec.ClaimRef, dir, pv.Annotations))
		if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ref.Namespace() && pv.Spec.ClaimRef.Name == "data-"+ref.Name+"-0" && dir != "" {
			return dir, pv.Name
		}
	}
	t.Fatalf("no kept copy of %s; the volumes that moved:\n%s", ref, strings.Join(moved, "\n"))
	return "", ""
}

// checkPruned checks that the copy's directory is gone from the host and its volume from the
// cluster.
func (l *moveLab) checkPruned(ctx context.Context, t *testing.T, dir, volume string) {
	t.Helper()
	if _, err := os.Stat(l.h.Path(dir)); !os.IsNotExist(err) {
		t.Errorf("the pruned copy's directory %s: %v", dir, err)
	}
	// The volume's deletion waits for the PV controller to lift its protection, its claim gone.
	if err := kube.Poll(ctx, 2*time.Minute, "the pruned copy's volume "+volume+" to go", func(ctx context.Context) (bool, string, error) {
		pv, err := l.c.Kube.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, "", nil
		case err != nil:
			return false, err.Error(), nil
		case pv.DeletionTimestamp == nil:
			return false, "", fmt.Errorf("the pruned copy's volume %s is not being deleted", volume)
		}
		return false, fmt.Sprintf("being deleted, finalizers %v", pv.Finalizers), nil
	}); err != nil {
		t.Error(err)
	}
}

func (l *moveLab) checkKept(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(l.h.Path(dir)); err != nil {
		t.Errorf("a kept copy's directory %s: %v", dir, err)
	}
}

// servicePod is the service's Ready pod, once it runs with restarts restarts.
func (l *moveLab) servicePod(ctx context.Context, t *testing.T, ref service.Ref, restarts int32) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	if err := kube.Poll(ctx, 3*time.Minute, "pod "+ref.Name+"-0 Ready", func(ctx context.Context) (bool, string, error) {
		p, err := l.c.Kube.CoreV1().Pods(ref.Namespace()).Get(ctx, ref.Name+"-0", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		_, ready := prune.ReadySince(p)
		if !ready || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != restarts {
			return false, fmt.Sprintf("not Ready after %d restarts", restarts), nil
		}
		pod = p
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// pruned is TestMoveToLonghorn's last part: the copies its moves kept, pruned with the real kip
// over SSH. Each copy is held back by the condition the spec gives (the hour Ready, the day on a
// cluster without backups), the hour starts again after a container crash, --now and
// --delete-unproven each waive only their condition, and an orphan copy goes without checks.
// kip's clock is moved forward (KIP_FAULT_NOW) rather than waited for.
func (l *moveLab) pruned(ctx context.Context, t *testing.T) {
	db := service.Ref{Project: "shop", Environment: "staging", Name: "db"}
	uploads := service.Ref{Project: "shop", Environment: "staging", Name: "uploads"}
	k0 := service.Ref{Project: "shop", Environment: "staging", Name: "k0"}
	// checkOnLonghorn left every moved service stopped; db runs again, uploads and k0 stay stopped.
	if r := l.kip(t, nil, "service", "start", "db", "--project", "shop", "--environment", "staging"); r.ExitCode != 0 {
		t.Fatalf("kip service start db: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	dbDir, dbVolume := l.keptCopy(ctx, t, db)
	upDir, upVolume := l.keptCopy(ctx, t, uploads)
	k0Dir, k0Volume := l.keptCopy(ctx, t, k0)

	// Now: every copy is held back, by the hour and by the day.
	r := l.kip(t, nil, l.pruneArgs()...)
	if r.ExitCode != 0 {
		t.Fatalf("prune: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	for _, s := range []string{"No local copy to delete", "Kept:", "db in shop-staging: volume " + dbVolume, "of 1 h",
		"this cluster has no backups: waiting a day after the move, until"} {
		if !strings.Contains(r.Stderr, s) {
			t.Errorf("prune's output lacks %q", s)
		}
	}
	l.checkKept(t, dbDir)

	// kip status shows the same, with the space each copy uses.
	r = l.kip(t, nil, "status", "-o", "json")
	if r.ExitCode != 0 {
		t.Fatalf("kip status: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	var rep status.Report
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("kip status -o json: %v\n%s", err, r.Stdout)
	}
	var found *prune.Kept
	for i := range rep.KeptCopies {
		if rep.KeptCopies[i].Volume == dbVolume {
			found = &rep.KeptCopies[i]
		}
	}
	if found == nil || found.UsedBytes == nil || *found.UsedBytes < 20000*256 || rep.KeptCopiesBytes < *found.UsedBytes || len(found.Holds) != 2 {
		t.Errorf("kip status's kept copy of db: %+v (total %d)", found, rep.KeptCopiesBytes)
	}

	// A crash restarts the hour: the container of db's pod is killed and restarted; at a time an
	// hour after the pod first became Ready, the copy is held back by the restart.
	pod := l.servicePod(ctx, t, db, 0)
	first, _ := prune.ReadySince(pod)
	// Condition times have whole seconds: the restart must fall in a later second.
	for time.Since(first) < 2*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	l.crash(ctx, t, pod)
	restarted, _ := prune.ReadySince(l.servicePod(ctx, t, db, 1))
	if !restarted.After(first) {
		t.Fatalf("db's pod Ready since %s after its restart, first since %s", restarted, first)
	}
	r = l.kip(t, clockAt(first.Add(prune.ReadyFor)), l.pruneArgs("db", "--project", "shop", "--now")...)
	// Ready for an hour less the restart's few seconds.
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "No local copy to delete") || !strings.Contains(r.Stderr, "pod db-0 has been Ready for 5") ||
		!strings.Contains(r.Stderr, " min of 1 h") {
		t.Errorf("prune an hour after the first Ready, after a restart: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkKept(t, dbDir)
	// An hour after the restart the copy may go, and is listed to be deleted; kip pauses after the
	// listing and the prompt, the container crashes again, and the delete, reading everything
	// again, keeps the copy.
	p, paused := l.s.Paused(t, l.home, clockAt(restarted.Add(prune.ReadyFor)), "before:delete", l.args(l.pruneArgs("db", "--project", "shop", "--now"))...)
	pod = l.servicePod(ctx, t, db, 1)
	for time.Since(restarted) < 2*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	l.crash(ctx, t, pod)
	again, _ := prune.ReadySince(l.servicePod(ctx, t, db, 2))
	if err := os.Remove(paused); err != nil {
		t.Fatal(err)
	}
	r = p.Wait(t, 10*time.Minute)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "To delete, every condition met:") ||
		!strings.Contains(r.Stderr, "kept 1 copy whose conditions changed since the listing: db in shop-staging: pod db-0 has been Ready for ") ||
		strings.Contains(r.Stderr, "Deleted the local copy") {
		t.Errorf("prune with a crash between the listing and the delete: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	l.checkKept(t, dbDir)
	// An hour after the last restart, --now deletes it: the day's wait waived, the hour passed.
	r = l.kip(t, clockAt(again.Add(prune.ReadyFor)), l.pruneArgs("db", "--project", "shop", "--now")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Deleted the local copy of db in shop-staging") {
		t.Errorf("prune --now an hour after the restart: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkPruned(ctx, t, dbDir, dbVolume)

	// A change of the copy count under way holds a copy back, whatever is waived: the Longhorn
	// volume of service k0 (stopped, its hour and day waived) asks for a second copy that does not
	// exist yet; then for one copy again.
	pv, err := l.c.Kube.CoreV1().PersistentVolumes().Get(ctx, k0Volume, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lhName := pv.Annotations[move.MovedToAnnotation]
	copies := func(n int) {
		t.Helper()
		if _, err := l.c.Longhorn.LonghornV1beta2().Volumes(standin.Namespace).Patch(ctx, lhName, types.MergePatchType,
			[]byte(fmt.Sprintf(`{"spec":{"numberOfReplicas":%d}}`, n)), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	copies(2)
	r = l.kip(t, clockAt(time.Now().Add(48*time.Hour)), l.pruneArgs("k0", "--project", "shop", "--now", "--delete-unproven")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "No local copy to delete") ||
		!strings.Contains(r.Stderr, "Longhorn is changing the copies of volume "+lhName+": 1 of 2 healthy, 1 in all") {
		t.Errorf("prune k0 during a copy count change: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
	}
	l.checkKept(t, k0Dir)
	copies(1)

	// A stopped service keeps its copy: --delete-unproven waives the hour, not the day; with --now
	// too the copy goes.
	if r := l.kip(t, nil, "service", "stop", "uploads", "--project", "shop", "--environment", "staging"); r.ExitCode != 0 {
		t.Fatalf("kip service stop uploads: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	r = l.kip(t, nil, l.pruneArgs("uploads", "--project", "shop", "--delete-unproven")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "No local copy to delete") || !strings.Contains(r.Stderr, "waiting a day after the move") ||
		strings.Contains(r.Stderr, "no pod of service uploads in shop-staging") {
		t.Errorf("prune uploads --delete-unproven: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkKept(t, upDir)
	r = l.kip(t, nil, l.pruneArgs("uploads", "--project", "shop", "--now")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "no pod of service uploads in shop-staging runs on Longhorn volume") {
		t.Errorf("prune uploads --now, the service stopped: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkKept(t, upDir)
	r = l.kip(t, nil, l.pruneArgs("uploads", "--project", "shop", "--now", "--delete-unproven")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Deleted the local copy of uploads in shop-staging") {
		t.Errorf("prune uploads --now --delete-unproven: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkPruned(ctx, t, upDir, upVolume)

	// A move not finished keeps the copy, whatever is waived, and kip names the command that
	// finishes it, which does: the move of service pending is killed after its commit.
	pending := service.Ref{Project: "shop", Environment: "staging", Name: "pending"}
	l.killedBefore(ctx, t, pending, "start")
	pendingDir, pendingVolume := l.keptCopy(ctx, t, pending)
	r = l.kip(t, clockAt(time.Now().Add(48*time.Hour)), l.pruneArgs("pending", "--project", "shop", "--now", "--delete-unproven")...)
	finish := regexp.MustCompile(`its move to Longhorn is not finished: '(kip [^']+)' finishes it`).FindStringSubmatch(r.Stderr)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "No local copy to delete") || finish == nil {
		t.Fatalf("prune pending, its move unfinished: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkKept(t, pendingDir)
	if r := l.kip(t, nil, strings.Fields(finish[1])[1:]...); r.ExitCode != 0 || !strings.Contains(r.Stderr, "Service pending in shop-staging now keeps its data on Longhorn") {
		t.Errorf("%s, as prune printed it: exit %d\n%s", finish[1], r.ExitCode, r.Stderr)
	}

	// A service that replaced its volume keeps the copy, whatever is waived: the data claim of
	// service pending, stopped, is deleted and the service started again on a new, empty volume.
	if r := l.kip(t, nil, "service", "stop", "pending", "--project", "shop", "--environment", "staging"); r.ExitCode != 0 {
		t.Fatalf("kip service stop pending: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.deleteClaim(ctx, t, pending.Namespace(), "data-pending-0")
	if r := l.kip(t, nil, "service", "start", "pending", "--project", "shop", "--environment", "staging"); r.ExitCode != 0 {
		t.Fatalf("kip service start pending: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if err := service.WaitRunning(ctx, l.c.Dynamic, l.c.Kube, pending, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	r = l.kip(t, clockAt(time.Now().Add(48*time.Hour)), l.pruneArgs("pending", "--project", "shop", "--now", "--delete-unproven")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "No local copy to delete") ||
		!strings.Contains(r.Stderr, "service pending in shop-staging's claim data-pending-0 names volume ") ||
		!strings.Contains(r.Stderr, "this copy may hold the only original data") {
		t.Errorf("prune pending after its volume was replaced: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkKept(t, pendingDir)

	// Orphans: services k0 and pending deleted with their data claims; their copies go without
	// checks, both in one prune, over one SSH connection to the server.
	for _, name := range []string{"k0", "pending"} {
		if r := l.kip(t, nil, "service", "delete", name, "--project", "shop", "--environment", "staging", "--delete-data"); r.ExitCode != 0 {
			t.Fatalf("kip service delete %s: exit %d\n%s", name, r.ExitCode, r.Stderr)
		}
		l.deleteClaim(ctx, t, k0.Namespace(), "data-"+name+"-0")
	}
	r = l.kip(t, nil, l.pruneArgs()...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "To delete without checks, their service and data claim both gone:") ||
		!strings.Contains(r.Stderr, "Deleted the local copy of claim shop-staging/data-k0-0") ||
		!strings.Contains(r.Stderr, "Deleted the local copy of claim shop-staging/data-pending-0") {
		t.Errorf("prune with two orphan copies: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkPruned(ctx, t, k0Dir, k0Volume)
	l.checkPruned(ctx, t, pendingDir, pendingVolume)
}

// deleteClaim deletes claim ns/name and waits until it is gone.
func (l *moveLab) deleteClaim(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	claims := l.c.Kube.CoreV1().PersistentVolumeClaims(ns)
	if err := claims.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, 3*time.Minute, "claim "+ns+"/"+name+" to go", func(ctx context.Context) (bool, string, error) {
		_, err := claims.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), "", nil
	}); err != nil {
		t.Fatal(err)
	}
}

// clockAt is the environment that sets kip's clock a second after tm.
func clockAt(tm time.Time) []string {
	return []string{clock.Env + "=" + tm.Add(time.Second).UTC().Format(time.RFC3339)}
}

// crash kills the container of pod with SIGKILL through containerd, as a crash would; the
// kubelet restarts it.
func (l *moveLab) crash(ctx context.Context, t *testing.T, pod *corev1.Pod) {
	t.Helper()
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	kill := sshx.Command(e2e.StandinBinDir+"/ctr", "--address", "/run/k3s/containerd/containerd.sock", "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id)
	if out, err := l.h.Run(ctx, kill); err != nil {
		t.Fatalf("kill the container of %s: %v\n%s", pod.Name, err, out)
	}
}

// startVelero runs Velero in the lab's cluster as its chart runs it (file-system backups through
// its node agent, into gofakes3 on the lab's gateway) and records external backup storage, as
// kip install does.
func (l *moveLab) startVelero(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := e2e.ImportVeleroImages(ctx, l.h); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InstallVeleroCRDs(ctx, l.c.APIExt); err != nil {
		t.Fatal(err)
	}
	v := velerotest.StartInCluster(t, l.cfg, lab.Gateway)
	if _, err := cluster.UpdateRecord(ctx, l.c.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Backups, rec.BackupLocation = cluster.BackupsExternal, &cluster.BackupLocation{Bucket: v.Bucket, Endpoint: v.S3URL}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// prunedAfterBackup is TestMovePrunedAfterBackup: moves on a cluster with backups (Velero as its
// chart runs it, with file-system backups through its node agent, into gofakes3 on the lab's
// gateway): the move refuses to start without a backup of the project; the backup it then
// relies on, made before the move, does not count for the prune; one made after it does, unless
// it has expired or is being deleted; a Postgres service with consistent backups waits the day
// whatever the backups.
func (l *moveLab) prunedAfterBackup(ctx context.Context, t *testing.T) {
	l.startVelero(ctx, t)
	cache := service.Ref{Project: "books", Environment: "prod", Name: "cache"}
	ledger := service.Ref{Project: "books", Environment: "prod", Name: "ledger"}
	l.project(ctx, t, "books", "prod")
	l.serviceOfType(ctx, t, cache, "redis", "1Gi", smallTree(t, 100))
	l.service(ctx, t, ledger, "1Gi", smallTree(t, 100))
	moveCache := []string{"service", "storage", "longhorn", "cache", "--project", "books", "--environment", "prod"}
	if r := l.kip(t, nil, moveCache...); r.ExitCode != 1 || !strings.Contains(r.Stderr, "a move needs a completed backup of project books") ||
		!strings.Contains(r.Stderr, "back it up with 'kip backup create --project books --wait'") || strings.Count(r.Stderr, "kip backup create") != 1 {
		t.Fatalf("the move without a backup: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	// A third service of the project, archive, is stopped while the backup runs: Velero skips its
	// volume with a warning (no running pod mounts it), so the backup is not a completed backup of
	// the project, and kip backup create says so; it still holds all of cache's and ledger's data,
	// which is what their moves need.
	archive := service.Ref{Project: "books", Environment: "prod", Name: "archive"}
	l.service(ctx, t, archive, "1Gi", smallTree(t, 10))
	if r := l.kip(t, nil, "service", "stop", archive.Name, "--project", archive.Project, "--environment", archive.Environment); r.ExitCode != 0 {
		t.Fatalf("kip service stop archive: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	r := l.kip(t, nil, "backup", "create", "--project", "books", "--wait")
	started := regexp.MustCompile(`Started backup (\S+)`).FindStringSubmatch(r.Stderr)
	if r.ExitCode != 1 || started == nil || !strings.Contains(r.Stderr, "no running pod mounts claim books-prod/data-archive-0") {
		t.Fatalf("kip backup create with service archive stopped: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	before := started[1]
	for _, ref := range []service.Ref{cache, ledger} {
		r := l.kip(t, nil, "service", "storage", "longhorn", ref.Name, "--project", ref.Project, "--environment", ref.Environment)
		if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Latest completed backup of project books: "+before) {
			t.Fatalf("the move of %s after backup %s: exit %d\n%s", ref, before, r.ExitCode, r.Stderr)
		}
	}
	if r := l.kip(t, nil, "service", "start", archive.Name, "--project", archive.Project, "--environment", archive.Environment); r.ExitCode != 0 {
		t.Fatalf("kip service start archive: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	cacheDir, cacheVolume := l.keptCopy(ctx, t, cache)
	ledgerDir, _ := l.keptCopy(ctx, t, ledger)
	readySince := func(ref service.Ref) time.Time {
		since, _ := prune.ReadySince(l.servicePod(ctx, t, ref, 0))
		return since
	}
	// An hour after both pods became Ready, only the backup holds their copies.
	at := clockAt(later(readySince(cache), readySince(ledger)).Add(prune.ReadyFor))
	waiting := "waiting for a completed backup made after the move ('kip backup create'), or until "
	pruneBooks := func(why string, want ...string) {
		t.Helper()
		r := l.kip(t, at, l.pruneArgs()...)
		if r.ExitCode != 0 {
			t.Fatalf("prune, %s: exit %d\n%s", why, r.ExitCode, r.Stderr)
		}
		for _, s := range want {
			if !strings.Contains(r.Stderr, s) {
				t.Errorf("prune, %s: the output lacks %q\n%s", why, s, r.Stderr)
			}
		}
	}
	dumpWait := "ledger in books-prod: volume "
	pruneBooks("with backup "+before+" made before the move", "cache in books-prod: volume "+cacheVolume, waiting, dumpWait,
		"a postgres service with consistent backups waits a day after the move")
	l.checkKept(t, cacheDir)

	after := l.backup(t, "books")
	// Velero's server stops, so that the backup stays as the test changes it.
	l.stopVelero(ctx, t)
	backups := l.c.Dynamic.Resource(velerotest.BackupResource).Namespace(velerotest.Namespace)
	b, err := kube.GetAs[velerov1.Backup](ctx, l.c.Dynamic, velerotest.BackupResource, velerotest.Namespace, after)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status.Expiration == nil {
		t.Fatalf("backup %s has no expiry", after)
	}
	setExpiration := func(tm time.Time) {
		t.Helper()
		patch := fmt.Sprintf(`{"status":{"expiration":%q}}`, tm.UTC().Format(time.RFC3339))
		if _, err := backups.Patch(ctx, after, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setExpiration(time.Now().Add(-time.Minute))
	pruneBooks("with backup "+after+" expired", waiting)
	l.checkKept(t, cacheDir)
	setExpiration(b.Status.Expiration.Time)

	dbrs := l.c.Dynamic.Resource(velerov1.SchemeGroupVersion.WithResource("deletebackuprequests")).Namespace(velerotest.Namespace)
	dbr := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "velero.io/v1", "kind": "DeleteBackupRequest",
		"metadata": map[string]any{"name": after + "-delete", "labels": map[string]any{velerov1.BackupNameLabel: after, velerov1.BackupUIDLabel: string(b.UID)}},
		"spec":     map[string]any{"backupName": after}}}
	if _, err := dbrs.Create(ctx, dbr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pruneBooks("with backup "+after+" being deleted", waiting)
	l.checkKept(t, cacheDir)
	if err := dbrs.Delete(ctx, after+"-delete", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	pruneBooks("with backup "+after+" made after the move", "Deleted the local copy of cache in books-prod", dumpWait,
		"a postgres service with consistent backups waits a day after the move")
	l.checkPruned(ctx, t, cacheDir, cacheVolume)
	l.checkKept(t, ledgerDir)
}

// backup runs kip backup create for project and returns the completed backup's name.
func (l *moveLab) backup(t *testing.T, project string) string {
	t.Helper()
	r := l.kip(t, nil, "backup", "create", "--project", project, "--wait")
	name := regexp.MustCompile(`Started backup (\S+)`).FindStringSubmatch(r.Stderr)
	if r.ExitCode != 0 || name == nil {
		t.Fatalf("kip backup create --project %s --wait: exit %d\n%s", project, r.ExitCode, r.Stderr)
	}
	return name[1]
}

// stopVelero scales Velero's server to no pod and waits until its pod is gone.
func (l *moveLab) stopVelero(ctx context.Context, t *testing.T) {
	t.Helper()
	deployments := l.c.Kube.AppsV1().Deployments(velerotest.Namespace)
	d, err := deployments.Patch(ctx, velerotest.Deployment, types.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	selector := metav1.FormatLabelSelector(d.Spec.Selector)
	if err := kube.Poll(ctx, 3*time.Minute, "Velero's server to stop", func(ctx context.Context) (bool, string, error) {
		pods, err := l.c.Kube.CoreV1().Pods(velerotest.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, "", err
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items)), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
