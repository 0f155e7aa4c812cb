package backup

import (
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/kube"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// completed is a backup Velero finished cleanly, holding claims (kip's record of them).
func completed(t *testing.T, claims ...Claim) *velerov1.Backup {
	t.Helper()
	b := &velerov1.Backup{
		ObjectMeta: metav1.ObjectMeta{Name: "shop-1", Namespace: "velero", UID: "u1"},
		Spec:       velerov1.BackupSpec{IncludedNamespaces: []string{"shop-prod"}},
		Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseCompleted,
			StartTimestamp: &metav1.Time{Time: now.Add(-time.Hour)},
			Expiration:     &metav1.Time{Time: now.Add(29 * 24 * time.Hour)}},
	}
	if claims != nil {
		key, value, err := kube.RecordAnnotation(volumesRecord, volumesRecordVersion, VolumesRecord{Claims: claims})
		if err != nil {
			t.Fatal(err)
		}
		b.Annotations = map[string]string{key: value}
	}
	return b
}

func pvb(backup, backupUID, ns, claim, claimUID string, phase velerov1.PodVolumeBackupPhase) velerov1.PodVolumeBackup {
	return velerov1.PodVolumeBackup{
		ObjectMeta: metav1.ObjectMeta{Name: backup + "-" + claim, Namespace: "velero",
			Labels:      map[string]string{velerov1.BackupNameLabel: backup, velerov1.BackupUIDLabel: backupUID, velerov1.PVCUIDLabel: claimUID},
			Annotations: map[string]string{pvcNameAnnotation: claim}},
		Spec:   velerov1.PodVolumeBackupSpec{Pod: corev1.ObjectReference{Namespace: ns, Name: "db-0"}, Volume: "data"},
		Status: velerov1.PodVolumeBackupStatus{Phase: phase, Message: map[bool]string{true: "read /data: permission denied"}[phase == velerov1.PodVolumeBackupPhaseFailed]},
	}
}

func dbr(backup, backupUID string, phase velerov1.DeleteBackupRequestPhase) velerov1.DeleteBackupRequest {
	return velerov1.DeleteBackupRequest{
		ObjectMeta: metav1.ObjectMeta{Name: backup + "-del", Labels: map[string]string{velerov1.BackupUIDLabel: backupUID}},
		Spec:       velerov1.DeleteBackupRequestSpec{BackupName: backup},
		Status:     velerov1.DeleteBackupRequestStatus{Phase: phase},
	}
}

func TestCheck(t *testing.T) {
	data := Claim{Namespace: "shop-prod", Name: "data-db-0", UID: "c1"}
	done := pvb("shop-1", "u1", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseCompleted)
	tests := []struct {
		name   string
		in     func() Input
		state  State
		reason string // a substring of the reasons; "" for none
	}{
		{"completed with its volume", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{done}}
		}, StateCompleted, ""},
		{"Velero says Completed but the pod was not Running: no volume backup", func() Input {
			b := completed(t, data)
			b.Status.Warnings = 1
			return Input{Backup: b}
		}, StateNotCompleted, "holds no data for volume shop-prod/data-db-0"},
		{"the volume backup failed", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{pvb("shop-1", "u1", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseFailed)}}
		}, StateNotCompleted, "is Failed: read /data: permission denied"},
		{"a volume backup of an earlier backup of the same name does not count", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{pvb("shop-1", "old", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseCompleted)}}
		}, StateNotCompleted, "holds no data"},
		{"a volume backup of a replaced claim of the same name does not count", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{pvb("shop-1", "u1", "shop-prod", "data-db-0", "other", velerov1.PodVolumeBackupPhaseCompleted)}}
		}, StateNotCompleted, "holds no data"},
		{"expired", func() Input {
			b := completed(t, data)
			b.Status.Expiration = &metav1.Time{Time: now.Add(-time.Minute)}
			return Input{Backup: b, PVBs: []velerov1.PodVolumeBackup{done}}
		}, StateNotCompleted, "it expired at 2026-12-02T11:59:00Z"},
		{"expiring this very second", func() Input {
			b := completed(t, data)
			b.Status.Expiration = &metav1.Time{Time: now}
			return Input{Backup: b, PVBs: []velerov1.PodVolumeBackup{done}}
		}, StateNotCompleted, "expired"},
		{"no expiry", func() Input {
			b := completed(t, data)
			b.Status.Expiration = nil
			return Input{Backup: b, PVBs: []velerov1.PodVolumeBackup{done}}
		}, StateNotCompleted, "no expiry"},
		{"phase Deleting", func() Input {
			b := completed(t, data)
			b.Status.Phase = velerov1.BackupPhaseDeleting
			return Input{Backup: b, PVBs: []velerov1.PodVolumeBackup{done}}
		}, StateNotCompleted, "being deleted"},
		{"a DeleteBackupRequest not yet processed", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{done}, DBRs: []velerov1.DeleteBackupRequest{dbr("shop-1", "u1", "")}}
		}, StateNotCompleted, "being deleted (DeleteBackupRequest shop-1-del, New)"},
		{"a DeleteBackupRequest in progress", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{done}, DBRs: []velerov1.DeleteBackupRequest{dbr("shop-1", "u1", velerov1.DeleteBackupRequestPhaseInProgress)}}
		}, StateNotCompleted, "InProgress"},
		{"a processed DeleteBackupRequest that left the backup (deletion failed)", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{done}, DBRs: []velerov1.DeleteBackupRequest{dbr("shop-1", "u1", velerov1.DeleteBackupRequestPhaseProcessed)}}
		}, StateCompleted, ""},
		{"a DeleteBackupRequest for an earlier backup of the same name", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{done}, DBRs: []velerov1.DeleteBackupRequest{dbr("shop-1", "old", velerov1.DeleteBackupRequestPhaseInProgress)}}
		}, StateCompleted, ""},
		{"deletionTimestamp", func() Input {
			b := completed(t, data)
			b.DeletionTimestamp = &metav1.Time{Time: now}
			return Input{Backup: b, PVBs: []velerov1.PodVolumeBackup{done}}
		}, StateNotCompleted, "being deleted"},
		{"errors", func() Input {
			b := completed(t, data)
			b.Status.Errors = 2
			return Input{Backup: b, PVBs: []velerov1.PodVolumeBackup{done}}
		}, StateNotCompleted, "2 errors"},
		{"partially failed", func() Input {
			b := completed(t, data)
			b.Status.Phase, b.Status.Errors = velerov1.BackupPhasePartiallyFailed, 1
			return Input{Backup: b, PVBs: []velerov1.PodVolumeBackup{done}}
		}, StateNotCompleted, "phase PartiallyFailed"},
		{"failed validation", func() Input {
			b := completed(t, data)
			b.Status.Phase, b.Status.ValidationErrors = velerov1.BackupPhaseFailedValidation, []string{"backup storage location 'x' not found"}
			return Input{Backup: b}
		}, StateNotCompleted, "phase FailedValidation: backup storage location 'x' not found"},
		{"queued is waiting, not failure", func() Input {
			b := completed(t, data)
			b.Status.Phase, b.Status.QueuePosition = velerov1.BackupPhaseQueued, 2
			return Input{Backup: b}
		}, StateWaiting, "queued behind other backups (position 2)"},
		{"ready to start is waiting", func() Input {
			b := completed(t, data)
			b.Status.Phase = velerov1.BackupPhaseReadyToStart
			return Input{Backup: b}
		}, StateWaiting, "ready to start"},
		{"new is waiting", func() Input {
			b := completed(t, data)
			b.Status.Phase = ""
			return Input{Backup: b}
		}, StateWaiting, "not started"},
		{"in progress is waiting", func() Input {
			b := completed(t, data)
			b.Status.Phase, b.Status.Progress = velerov1.BackupPhaseInProgress, &velerov1.BackupProgress{TotalItems: 40, ItemsBackedUp: 12}
			return Input{Backup: b}
		}, StateWaiting, "12 of 40 items"},
		{"a backup kip did not make, without warnings", func() Input {
			return Input{Backup: completed(t)}
		}, StateCompleted, ""},
		{"a backup kip did not make, with warnings", func() Input {
			b := completed(t)
			b.Status.Warnings = 3
			return Input{Backup: b}
		}, StateNotCompleted, "not made by kip backup create"},
		{"a claim the caller needs, held", func() Input {
			return Input{Backup: completed(t), PVBs: []velerov1.PodVolumeBackup{done}, Need: []Claim{{Namespace: "shop-prod", Name: "data-db-0"}}}
		}, StateCompleted, ""},
		{"a claim the caller needs, not held", func() Input {
			return Input{Backup: completed(t, data), PVBs: []velerov1.PodVolumeBackup{done}, Need: []Claim{{Namespace: "shop-prod", Name: "data-web-0"}}}
		}, StateNotCompleted, "holds no data for volume shop-prod/data-web-0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in()
			in.Now = now
			v := Check(in)
			if v.State != tt.state {
				t.Fatalf("state %s, want %s (reasons: %q)", v.State, tt.state, v.Reasons)
			}
			got := strings.Join(v.Reasons, "; ")
			if tt.reason == "" && got != "" {
				t.Errorf("reasons %q, want none", got)
			}
			if !strings.Contains(got, tt.reason) {
				t.Errorf("reasons %q, want one containing %q", got, tt.reason)
			}
			if err := v.Err("shop-1"); (err == nil) != (tt.state == StateCompleted) || err != nil && !strings.Contains(err.Error(), "backup shop-1") {
				t.Errorf("Err = %v", err)
			}
		})
	}
}

func TestLatest(t *testing.T) {
	data := Claim{Namespace: "shop-prod", Name: "data-db-0", UID: "c1"}
	at := func(name string, uid types.UID, h int, phase velerov1.BackupPhase, ns ...string) velerov1.Backup {
		b := completed(t, data)
		b.Name, b.UID, b.Status.Phase, b.Spec.IncludedNamespaces = name, uid, phase, ns
		b.Status.StartTimestamp = &metav1.Time{Time: now.Add(time.Duration(-h) * time.Hour)}
		return *b
	}
	s := &Snapshot{Now: now, Backups: []velerov1.Backup{
		at("old", "u-old", 5, velerov1.BackupPhaseCompleted, "shop-prod"),
		at("mid", "u-mid", 3, velerov1.BackupPhaseCompleted, "shop-*"),
		at("other", "u-other", 2, velerov1.BackupPhaseCompleted, "blog-prod"),
		at("new", "u-new", 1, velerov1.BackupPhasePartiallyFailed, "shop-prod"),
	}, PVBs: []velerov1.PodVolumeBackup{
		pvb("old", "u-old", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseCompleted),
		pvb("mid", "u-mid", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseCompleted),
		pvb("new", "u-new", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseCompleted),
	}}
	b, err := s.Latest([]string{"shop-prod"})
	if err != nil || b.Name != "mid" {
		t.Fatalf("Latest = %v, %v; want mid (the newest is partly failed, glob shop-* holds shop-prod)", b, err)
	}
	_, err = s.Latest([]string{"blog-prod"})
	if err == nil || !strings.Contains(err.Error(), "no completed backup holds blog-prod; the newest, backup other is not a completed backup: it holds no data for volume shop-prod/data-db-0") {
		t.Errorf("Latest(blog-prod) = %v", err)
	}
	_, err = s.Latest([]string{"wiki-prod"})
	if err == nil || err.Error() != "no backup holds wiki-prod" {
		t.Errorf("Latest(wiki-prod) = %v", err)
	}
}

func TestHolds(t *testing.T) {
	b := &velerov1.Backup{Spec: velerov1.BackupSpec{IncludedNamespaces: []string{"shop-*", "blog"}, ExcludedNamespaces: []string{"shop-tmp"}}}
	for ns, want := range map[string]bool{"shop-prod": true, "blog": true, "shop-tmp": false, "blog-prod": false} {
		if got := holds(b, ns); got != want {
			t.Errorf("holds(%s) = %v, want %v", ns, got, want)
		}
	}
	all := &velerov1.Backup{}
	if !holds(all, "anything") {
		t.Error("a backup with no included namespaces holds every namespace")
	}
}

// TestLatestHolding: a backup kip made while another service of the project was stopped holds
// nothing of that service's volume and is no completed backup of the project, but it is one of
// the running service's data, which is what a move and a prune need; a partly failed backup, or
// one without a completed file-system backup of a volume the service mounts, never is.
func TestLatestHolding(t *testing.T) {
	data := Claim{Namespace: "shop-prod", Name: "data-db-0", UID: "c1"}
	dump := Claim{Namespace: "shop-prod", Name: "dump-db-0", UID: "c2"}
	stopped := Claim{Namespace: "shop-prod", Name: "data-cache-0", UID: "c3"}
	at := func(name string, uid types.UID, h int, phase velerov1.BackupPhase) velerov1.Backup {
		b := completed(t, data, dump, stopped)
		b.Name, b.UID, b.Status.Phase = name, uid, phase
		b.Status.StartTimestamp = &metav1.Time{Time: now.Add(time.Duration(-h) * time.Hour)}
		return *b
	}
	s := &Snapshot{Now: now, Backups: []velerov1.Backup{
		at("held", "u-held", 4, velerov1.BackupPhaseCompleted),
		at("nodump", "u-nodump", 3, velerov1.BackupPhaseCompleted),
		at("partly", "u-partly", 2, velerov1.BackupPhasePartiallyFailed),
	}, PVBs: []velerov1.PodVolumeBackup{
		pvb("held", "u-held", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseCompleted),
		pvb("held", "u-held", "shop-prod", "dump-db-0", "c2", velerov1.PodVolumeBackupPhaseCompleted),
		pvb("nodump", "u-nodump", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseCompleted),
		pvb("partly", "u-partly", "shop-prod", "data-db-0", "c1", velerov1.PodVolumeBackupPhaseCompleted),
		pvb("partly", "u-partly", "shop-prod", "dump-db-0", "c2", velerov1.PodVolumeBackupPhaseCompleted),
	}}
	if _, err := s.Latest([]string{"shop-prod"}); err == nil || !strings.Contains(err.Error(), "it holds no data for volume shop-prod/data-cache-0") {
		t.Errorf("Latest = %v, want none: every backup lacks the stopped service's volume", err)
	}
	b, err := s.LatestHolding([]string{"shop-prod"}, Claim{Namespace: "shop-prod", Name: "data-db-0"}, Claim{Namespace: "shop-prod", Name: "dump-db-0"})
	if err != nil || b.Name != "held" {
		t.Fatalf("LatestHolding = %v, %v; want held (nodump lacks the dump volume, partly is partly failed)", b, err)
	}
	if v := s.Holds(&s.Backups[1], data, dump); v.State == StateCompleted || !strings.Contains(strings.Join(v.Reasons, "; "), "no data for volume shop-prod/dump-db-0") {
		t.Errorf("Holds(nodump) = %+v", v)
	}
}
