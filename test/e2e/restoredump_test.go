package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/e2e"
)

// restoreDumpHost is TestRestoreDump's host (lab22).
const restoreDumpHost = 21

// postgresWorkload runs a Postgres service as console-api runs one with consistent backups: the
// official image's interface (the lab's image, e2e.PostgresImage, is Debian's PostgreSQL under a
// stand-in of its entrypoint), the data directory pgdata at the top of the data volume, and a
// Velero pre-backup hook that writes a pg_dump archive onto the dump volume before the volumes
// are backed up.
var postgresWorkload = consolestandin.Workload{
	Image: e2e.PostgresImage,
	Env: []corev1.EnvVar{{Name: "POSTGRES_USER", Value: "kipper"}, {Name: "POSTGRES_DB", Value: "app"},
		{Name: "POSTGRES_HOST_AUTH_METHOD", Value: "trust"}, {Name: "PGDATA", Value: "/data/pgdata"}},
	Annotations: map[string]string{
		"pre.hook.backup.velero.io/container": "postgres",
		"pre.hook.backup.velero.io/command":   `["/bin/sh", "-c", "pg_dump -U kipper -Fc app > /dump/app.dump.tmp && mv /dump/app.dump.tmp /dump/app.dump"]`,
		"pre.hook.backup.velero.io/timeout":   "2m",
	},
}

// TestRestoreDump checks a Postgres service's backup with kip service restore-dump, on a cluster
// with Velero as its chart runs it: the service's pod (Debian's PostgreSQL) holds rows, a backup
// runs its pre-backup hook (pg_dump onto the dump volume) and backs both volumes up through the
// node agent; rows added afterwards are not in it. restore-dump reports the backup's tables and
// rows, Velero restored only the dump volume, and the service did not notice: the same pod, its
// rows, its claims. Killed after each of its writes in turn and run again, it reports the same and
// leaves nothing behind; a namespace of the scratch name that is not its own is refused.
func TestRestoreDump(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	l := setUpMoveLab(ctx, t, restoreDumpHost, func(c *consolestandin.Standin) {
		c.Workloads = map[string]consolestandin.Workload{"postgres": postgresWorkload}
	})
	if err := e2e.ImportPostgresImage(ctx, l.h); err != nil {
		t.Fatal(err)
	}
	l.startVelero(ctx, t)
	l.project(ctx, t, "shop", "prod")
	ref := service.Ref{Project: "shop", Environment: "prod", Name: "db"}
	ns := ref.Namespace()
	l.serviceOfType(ctx, t, ref, "postgres", "1Gi", func(string) {})
	psql := func(sql string) string {
		t.Helper()
		out, err := l.h.Run(ctx, sshx.Command("k3s", "kubectl", "exec", "-n", ns, "db-0", "-c", "postgres", "--",
			"psql", "-h", "127.0.0.1", "-U", "kipper", "-d", "app", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql))
		if err != nil {
			t.Fatalf("psql %q in the service's pod: %v\n%s", sql, err, out)
		}
		return strings.TrimSpace(out)
	}
	if err := kube.Poll(ctx, 3*time.Minute, "the service's Postgres to accept connections", func(ctx context.Context) (bool, string, error) {
		out, err := l.h.Run(ctx, sshx.Command("k3s", "kubectl", "exec", "-n", ns, "db-0", "-c", "postgres", "--", "pg_isready", "-h", "127.0.0.1", "-U", "kipper"))
		return err == nil, strings.TrimSpace(out), nil
	}); err != nil {
		t.Fatal(err)
	}
	psql("CREATE TABLE orders (id int PRIMARY KEY, item text); INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(1, 100) g; " +
		"CREATE SCHEMA shop; CREATE TABLE shop.items (name text); INSERT INTO shop.items VALUES ('a'), ('b'), ('c')")

	r := l.kip(t, nil, "backup", "create", "--namespace", ns, "--wait")
	if r.ExitCode != 0 {
		t.Fatalf("kip backup create --namespace %s --wait: exit %d\n%s", ns, r.ExitCode, r.Stderr)
	}
	// Rows the backup does not hold: the report is the backup's, not the live database's.
	psql("INSERT INTO orders SELECT g, 'later' FROM generate_series(101, 150) g")
	live := l.liveService(ctx, t, ref)

	// The scratch name taken by a namespace that is not a restore-dump's: refused, left alone.
	scratch := ns + "-db-dump"
	if _, err := l.c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scratch}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := l.kip(t, nil, "service", "restore-dump", "db"); r.ExitCode != 1 ||
		!strings.Contains(r.Stderr, "namespace "+scratch+" exists and is not the scratch namespace of a restore-dump of service db") {
		t.Fatalf("restore-dump with namespace %s taken: exit %d\n%s", scratch, r.ExitCode, r.Stderr)
	}
	if err := l.c.Kube.CoreV1().Namespaces().Delete(ctx, scratch, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	l.scratchGone(ctx, t, scratch)

	file := filepath.Join(t.TempDir(), "writes")
	start := time.Now()
	r = l.kip(t, []string{fault.WritesFileEnv + "=" + file}, "service", "restore-dump", "db", "-o", "json")
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Restoring the dump volume of db") || !strings.Contains(r.Stderr, "the service is not touched") {
		t.Fatalf("kip service restore-dump db: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("measured: kip service restore-dump of a 103-row database took %s; it printed:\n%s", time.Since(start).Round(100*time.Millisecond), r.Stderr)
	reference := dumpReport(t, r)
	if reference.Archive != "app.dump" || reference.Rows != 103 || len(reference.Tables) != 2 ||
		reference.Tables[0] != (backup.DumpTable{Schema: "public", Name: "orders", Rows: 100}) ||
		reference.Tables[1] != (backup.DumpTable{Schema: "shop", Name: "items", Rows: 3}) || reference.Bytes == 0 {
		t.Fatalf("the report %+v: want app.dump with public.orders 100 rows and shop.items 3", reference)
	}
	l.scratchGone(ctx, t, scratch)
	l.onlyDumpRestored(ctx, t, ref)
	l.sameService(ctx, t, ref, live)
	if got := psql("SELECT count(*) FROM orders"); got != "150" {
		t.Errorf("the live database holds %s orders after restore-dump, want 150", got)
	}

	all := faulttest.Writes(t, file)
	t.Logf("measured: kip service restore-dump made %d writes:\n%s", len(all), strings.Join(all, "\n"))
	if len(all) < 5 {
		t.Fatalf("restore-dump made %d writes, want at least the namespace, the modifier, the restore and two deletions", len(all))
	}
	for n := 1; n <= len(all); n++ {
		e2e.Run(t, fmt.Sprintf("killed after write %d, %s", n, all[n-1]), func(t *testing.T) {
			r := l.kip(t, []string{faulttest.KillAfter(n)}, "service", "restore-dump", "db", "-o", "json")
			if what := faulttest.Killed(t, faulttest.Result{Stderr: r.Stderr, Signal: r.Signal, Exit: r.ExitCode}, n); what != all[n-1] {
				t.Fatalf("write %d of this run is %q, of the uninterrupted one %q", n, what, all[n-1])
			}
			r = l.kip(t, nil, "service", "restore-dump", "db", "-o", "json")
			if r.ExitCode != 0 {
				t.Fatalf("restore-dump run again: exit %d\n%s", r.ExitCode, r.Stderr)
			}
			if got := dumpReport(t, r); fmt.Sprint(*got) != fmt.Sprint(*reference) {
				t.Errorf("run again, it reports %+v, not %+v\n%s", *got, *reference, r.Stderr)
			}
			l.scratchGone(ctx, t, scratch)
			l.sameService(ctx, t, ref, live)
		})
	}
}

func dumpReport(t *testing.T, r e2e.Result) *backup.DumpReport {
	t.Helper()
	var rep backup.DumpReport
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("restore-dump -o json: %v\n%s\n%s", err, r.Stdout, r.Stderr)
	}
	return &rep
}

// liveService is what restore-dump must leave as it is: the service's pod (UID, restarts) and
// what each of its claims is bound to.
func (l *moveLab) liveService(ctx context.Context, t *testing.T, ref service.Ref) string {
	t.Helper()
	pod := l.servicePod(ctx, t, ref, 0)
	var parts []string
	for _, st := range pod.Status.ContainerStatuses {
		parts = append(parts, fmt.Sprintf("pod %s %s, container %s restarted %d times", pod.Name, pod.UID, st.Name, st.RestartCount))
	}
	for _, c := range []string{"data-" + ref.Name + "-0", "dump-" + ref.Name + "-0"} {
		claim, err := l.c.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, c, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, fmt.Sprintf("claim %s %s bound to %s", c, claim.UID, claim.Spec.VolumeName))
	}
	return strings.Join(parts, "; ")
}

func (l *moveLab) sameService(ctx context.Context, t *testing.T, ref service.Ref, want string) {
	t.Helper()
	if got := l.liveService(ctx, t, ref); got != want {
		t.Errorf("the service after restore-dump: %s\nbefore: %s", got, want)
	}
}

// scratchGone checks that no scratch namespace and no resource modifier of a restore-dump is left.
func (l *moveLab) scratchGone(ctx context.Context, t *testing.T, scratch string) {
	t.Helper()
	if err := kube.Poll(ctx, 3*time.Minute, "namespace "+scratch+" to go", func(ctx context.Context) (bool, string, error) {
		_, err := l.c.Kube.CoreV1().Namespaces().Get(ctx, scratch, metav1.GetOptions{})
		return apierrors.IsNotFound(err), "", nil
	}); err != nil {
		t.Fatal(err)
	}
	cms, err := l.c.Kube.CoreV1().ConfigMaps(components.VeleroNamespace).List(ctx, metav1.ListOptions{LabelSelector: backup.DumpOfServiceLabel})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		t.Errorf("restore-dump left its resource modifier %s/%s", cm.Namespace, cm.Name)
	}
}

// onlyDumpRestored checks that Velero restored the dump volume alone: the one restore of ref's
// restore-dump has one PodVolumeRestore, of the volume dump, completed.
func (l *moveLab) onlyDumpRestored(ctx context.Context, t *testing.T, ref service.Ref) {
	t.Helper()
	restores, err := kube.ListAs[velerov1.Restore](ctx, l.c.Dynamic, velerov1.SchemeGroupVersion.WithResource("restores"), components.VeleroNamespace,
		metav1.ListOptions{LabelSelector: backup.DumpOfServiceLabel + "=" + ref.Name})
	if err != nil || len(restores) != 1 {
		t.Fatalf("restores of the restore-dump: %d, %v", len(restores), err)
	}
	pvrs, err := kube.ListAs[velerov1.PodVolumeRestore](ctx, l.c.Dynamic, velerov1.SchemeGroupVersion.WithResource("podvolumerestores"), components.VeleroNamespace,
		metav1.ListOptions{LabelSelector: velerov1.RestoreNameLabel + "=" + restores[0].Name})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pvrs {
		got = append(got, p.Spec.Volume+" "+string(p.Status.Phase))
	}
	if strings.Join(got, ", ") != "dump "+string(velerov1.PodVolumeRestorePhaseCompleted) {
		t.Errorf("restore %s restored volumes %v, want the dump volume alone, completed", restores[0].Name, got)
	}
}
