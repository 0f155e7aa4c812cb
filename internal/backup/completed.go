package backup

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
)

// What "a completed backup" means to every kip workflow: a service move requires one of the
// service's project, prune one made after the move, kip node reboot and each Longhorn upgrade step
// take one and stop unless it is one. Check is the only place that decides it.

// State is what kip makes of a backup.
type State string

const (
	// StateCompleted is a completed backup: every workflow may rely on it.
	StateCompleted State = "Completed"
	// StateWaiting is a backup that is queued or still running: not a failure.
	StateWaiting State = "Waiting"
	// StateNotCompleted is a backup that finished (or is being deleted) without being one that
	// kip relies on; Verdict.Reasons says why.
	StateNotCompleted State = "NotCompleted"
)

// Verdict is Check's answer.
type Verdict struct {
	State State `json:"state"`
	// Reasons say why the backup is not a completed backup, or what it waits for; empty when
	// State is StateCompleted.
	Reasons []string `json:"reasons,omitempty"`
}

// Err is nil for a completed backup, else an error naming the backup and what is missing.
func (v Verdict) Err(name string) error {
	switch v.State {
	case StateCompleted:
		return nil
	case StateWaiting:
		return fmt.Errorf("backup %s is not finished: %s", name, strings.Join(v.Reasons, "; "))
	default:
		return fmt.Errorf("backup %s is not a completed backup: %s", name, strings.Join(v.Reasons, "; "))
	}
}

// Claim is a PersistentVolumeClaim whose data a backup should hold: one its pods mounted when the
// backup was made. UID, when set, tells a claim from a later one of the same name.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

func (c Claim) String() string { return c.Namespace + "/" + c.Name }

// volumesRecord is kip's record on a Backup it created, kipper.run/backup-volumes (format 1):
// the claims whose data the backup should hold, taken just before it was created
// (docs/records.md).
const (
	volumesRecord        = "backup-volumes"
	volumesRecordVersion = 1
)

// VolumesRecord is the data of that record.
type VolumesRecord struct {
	Claims []Claim `json:"claims"`
}

// RecordedClaims reads the record; recorded is false when the backup has none (one kip did not
// create).
func RecordedClaims(b *velerov1.Backup) (claims []Claim, recorded bool, err error) {
	ref := kube.ObjectRef{Group: velerov1.SchemeGroupVersion.Group, Version: velerov1.SchemeGroupVersion.Version,
		Resource: backupsGVR.Resource, Namespace: b.Namespace, Name: b.Name}
	rec, found, err := kube.RecordFrom[VolumesRecord](ref, b.Annotations, volumesRecord, volumesRecordVersion)
	return rec.Claims, found, err
}

// Input is what Check decides from: the backup, the PodVolumeBackups and DeleteBackupRequests of
// its namespace (any backup's: Check picks the backup's own), the time, and the claims a caller
// needs the backup to hold beyond those kip recorded when it made it.
type Input struct {
	Backup *velerov1.Backup
	PVBs   []velerov1.PodVolumeBackup
	DBRs   []velerov1.DeleteBackupRequest
	Now    time.Time
	Need   []Claim
	// Only judges the backup's volumes by Need alone: a claim kip recorded that the caller does
	// not need (another service's, stopped while the backup ran, which Velero could not back
	// up) does not keep the backup from holding what the caller needs.
	Only bool
}

// waitingPhases are the phases of a backup that has not finished: New and Queued and
// ReadyToStart (Velero 1.18 queues concurrent backups) wait their turn, the others run.
var waitingPhases = []velerov1.BackupPhase{
	"", velerov1.BackupPhaseNew, velerov1.BackupPhaseQueued, velerov1.BackupPhaseReadyToStart,
	velerov1.BackupPhaseInProgress, velerov1.BackupPhaseWaitingForPluginOperations,
	velerov1.BackupPhaseWaitingForPluginOperationsPartiallyFailed,
	velerov1.BackupPhaseFinalizing, velerov1.BackupPhaseFinalizingPartiallyFailed,
}

// Check decides whether in.Backup is a completed backup: phase Completed with no errors, an
// expiry in the future, no deletion requested (phase not Deleting, no DeleteBackupRequest for it
// still to be processed, no deletionTimestamp), and a completed PodVolumeBackup for every claim it
// should hold. That last rule is the one that catches Velero's silent case: the volumes of a pod
// that is not Running are skipped with a warning and the backup still reports Completed with zero
// errors. For a backup kip did not create, which records no claims, kip cannot tell which volumes
// it should hold, so it must have no warnings either.
func Check(in Input) Verdict {
	b := in.Backup
	if why, deleting := beingDeleted(b, in.DBRs); deleting {
		return Verdict{State: StateNotCompleted, Reasons: []string{why}}
	}
	var reasons []string
	if slices.Contains(waitingPhases, b.Status.Phase) {
		return Verdict{State: StateWaiting, Reasons: []string{waitingText(b)}}
	}
	if b.Status.Phase != velerov1.BackupPhaseCompleted {
		r := "phase " + string(b.Status.Phase)
		if b.Status.FailureReason != "" {
			r += ": " + b.Status.FailureReason
		}
		if len(b.Status.ValidationErrors) > 0 {
			r += ": " + strings.Join(b.Status.ValidationErrors, "; ")
		}
		reasons = append(reasons, r)
	}
	if b.Status.Errors > 0 {
		reasons = append(reasons, cli.Count(b.Status.Errors, "error", "errors")+" (kip backup describe "+b.Name+" lists the volumes)")
	}
	if exp := b.Status.Expiration; exp == nil || !exp.After(in.Now) {
		if exp == nil {
			reasons = append(reasons, "it has no expiry")
		} else {
			reasons = append(reasons, "it expired at "+exp.UTC().Format(time.RFC3339))
		}
	}
	reasons = append(reasons, volumeGaps(in)...)
	if len(reasons) > 0 {
		return Verdict{State: StateNotCompleted, Reasons: reasons}
	}
	return Verdict{State: StateCompleted}
}

// beingDeleted says whether someone asked to delete b: its phase is Deleting, it has a
// deletionTimestamp, or a DeleteBackupRequest for it is not processed yet.
func beingDeleted(b *velerov1.Backup, dbrs []velerov1.DeleteBackupRequest) (why string, deleting bool) {
	for _, d := range dbrs {
		if dbrFor(&d, b) && d.Status.Phase != velerov1.DeleteBackupRequestPhaseProcessed {
			return fmt.Sprintf("it is being deleted (DeleteBackupRequest %s, %s)", d.Name, orNew(string(d.Status.Phase))), true
		}
	}
	if b.DeletionTimestamp != nil || b.Status.Phase == velerov1.BackupPhaseDeleting {
		return "it is being deleted", true
	}
	return "", false
}

// volumeGaps lists the claims the backup should hold and does not.
func volumeGaps(in Input) []string {
	b := in.Backup
	recorded, ok, err := RecordedClaims(b)
	if err != nil {
		return []string{err.Error()}
	}
	var reasons []string
	if in.Only {
		recorded = nil // each claim needed is looked for below, whoever made the backup
	} else if !ok && b.Status.Warnings > 0 {
		reasons = append(reasons, fmt.Sprintf("it was not made by kip backup create, so kip cannot tell which volumes it should hold, and Velero reported %s (a skipped volume is only a warning)", cli.Count(b.Status.Warnings, "warning", "warnings")))
	}
	want := append(slices.Clone(recorded), in.Need...)
	seen := map[string]bool{}
	own := BackupPVBs(b, in.PVBs)
	for _, c := range want {
		if seen[c.String()] {
			continue
		}
		seen[c.String()] = true
		pvb := findPVB(own, c)
		switch {
		case pvb == nil:
			reasons = append(reasons, fmt.Sprintf("it holds no data for volume %s: Velero made no file-system backup of it (it backs a volume up only through a Running pod that mounts it)", c))
		case pvb.Status.Phase != velerov1.PodVolumeBackupPhaseCompleted:
			r := fmt.Sprintf("the file-system backup of volume %s is %s", c, orNew(string(pvb.Status.Phase)))
			if pvb.Status.Message != "" {
				r += ": " + pvb.Status.Message
			}
			reasons = append(reasons, r)
		}
	}
	return reasons
}

// BackupPVBs picks b's PodVolumeBackups out of pvbs, by the backup's name and UID labels.
func BackupPVBs(b *velerov1.Backup, pvbs []velerov1.PodVolumeBackup) []velerov1.PodVolumeBackup {
	var out []velerov1.PodVolumeBackup
	for _, p := range pvbs {
		if p.Labels[velerov1.BackupNameLabel] == b.Name && (b.UID == "" || p.Labels[velerov1.BackupUIDLabel] == string(b.UID)) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return pvbClaim(&out[i]).String() < pvbClaim(&out[j]).String() })
	return out
}

// pvbClaim is the claim a PodVolumeBackup holds (Name "" for a pod volume without a claim).
func pvbClaim(p *velerov1.PodVolumeBackup) Claim {
	return Claim{Namespace: p.Spec.Pod.Namespace, Name: p.Annotations[pvcNameAnnotation], UID: p.Labels[velerov1.PVCUIDLabel]}
}

// pvcNameAnnotation is where Velero names a PodVolumeBackup's claim (velero's
// pkg/podvolume/configs.PVCNameAnnotation).
const pvcNameAnnotation = "velero.io/pvc-name"

// findPVB is the PodVolumeBackup of claim c, the completed one when there are several.
func findPVB(pvbs []velerov1.PodVolumeBackup, c Claim) *velerov1.PodVolumeBackup {
	var found *velerov1.PodVolumeBackup
	for i := range pvbs {
		got := pvbClaim(&pvbs[i])
		if got.Namespace != c.Namespace || (c.UID != "" && got.UID != "" && got.UID != c.UID) || (c.UID == "" || got.UID == "") && got.Name != c.Name {
			continue
		}
		if found == nil || pvbs[i].Status.Phase == velerov1.PodVolumeBackupPhaseCompleted {
			found = &pvbs[i]
		}
	}
	return found
}

// dbrFor reports whether d asks to delete b (by name, and by UID when d names one).
func dbrFor(d *velerov1.DeleteBackupRequest, b *velerov1.Backup) bool {
	if d.Spec.BackupName != b.Name {
		return false
	}
	uid := d.Labels[velerov1.BackupUIDLabel]
	return uid == "" || b.UID == "" || uid == string(b.UID)
}

func waitingText(b *velerov1.Backup) string {
	switch b.Status.Phase {
	case "", velerov1.BackupPhaseNew:
		return "Velero has not started it yet"
	case velerov1.BackupPhaseQueued:
		return fmt.Sprintf("queued behind other backups (position %d)", b.Status.QueuePosition)
	case velerov1.BackupPhaseReadyToStart:
		return "ready to start"
	}
	s := "running (" + string(b.Status.Phase)
	if p := b.Status.Progress; p != nil && p.TotalItems > 0 {
		s += fmt.Sprintf(", %d of %d items", p.ItemsBackedUp, p.TotalItems)
	}
	return s + ")"
}

func orNew(phase string) string {
	if phase == "" {
		return "New"
	}
	return phase
}
