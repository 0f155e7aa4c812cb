// Package backup is kip backup: create, list, describe, restore and drill Velero backups, export
// the keys a disaster recovery needs, and decide what "a completed backup" is for every other
// workflow (Check). It speaks to Velero through its v1 API objects (Backup, Restore,
// PodVolumeBackup, DeleteBackupRequest) and never runs the velero CLI. docs/backups.md is the
// operator's guide.
package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
)

// Velero's resources kip reads and writes, in Velero's namespace.
var (
	backupsGVR  = velerov1.SchemeGroupVersion.WithResource("backups")
	restoresGVR = velerov1.SchemeGroupVersion.WithResource("restores")
	pvbsGVR     = velerov1.SchemeGroupVersion.WithResource("podvolumebackups")
	pvrsGVR     = velerov1.SchemeGroupVersion.WithResource("podvolumerestores")
	dbrsGVR     = velerov1.SchemeGroupVersion.WithResource("deletebackuprequests")
	bslGVR      = velerov1.SchemeGroupVersion.WithResource("backupstoragelocations")
	projectsGVR = schema.GroupVersionResource{Group: "kipper.run", Version: "v1alpha1", Resource: "projects"}
)

// Options is what every kip backup command needs; cmd/kip fills it from the factory.
type Options struct {
	// Kube returns the cluster's API clients.
	Kube    func() (*kube.Clients, error)
	Printer *cli.Printer
	// JSON writes read commands' output as JSON (-o json); Out receives data.
	JSON bool
	Out  io.Writer
	// Now is the clock (time.Now when nil); tests pin it.
	Now func() time.Time
}

func (o *Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// ErrNoBackups is returned by every kip backup command on a cluster kip installed without Velero.
var ErrNoBackups = errors.New("this cluster has no backups: it runs on local storage and was installed without external backup storage, " +
	"and a backup on the server's own disk would be lost with that disk. " +
	"Add external storage with 'kip install --host HOST --backup-storage-bucket BUCKET --backup-storage-endpoint URL " +
	"--backup-storage-access-key-id ID --backup-storage-secret-access-key-file FILE' (see kip install --help); " +
	"read \"Re-running install\" in docs/install.md first: a re-run re-renders Dex's configuration, which resets users created in the console")

// env is what a kip backup command acts on.
type env struct {
	o   *Options
	cl  *kube.Clients
	rec cluster.Record
}

// load reads the cluster record and refuses a cluster without backups.
func load(ctx context.Context, o *Options) (*env, error) {
	cl, err := o.Kube()
	if err != nil {
		return nil, err
	}
	rec, err := cluster.ReadInstalled(ctx, cl.Dynamic)
	if err != nil {
		return nil, err
	}
	if rec.Backups == cluster.BackupsNone {
		return nil, ErrNoBackups
	}
	return &env{o: o, cl: cl, rec: rec}, nil
}

// loadBackup is load, then a snapshot and the backup named name in it.
func loadBackup(ctx context.Context, o *Options, name string) (*env, *Snapshot, *velerov1.Backup, error) {
	e, err := load(ctx, o)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := ReadSnapshot(ctx, e.cl, o.now())
	if err != nil {
		return nil, nil, nil, err
	}
	b, err := s.Find(name)
	return e, s, b, err
}

// Snapshot is Velero's backups with their PodVolumeBackups and DeleteBackupRequests, read with
// one list request per kind: what list, describe and every workflow's Check read.
type Snapshot struct {
	Backups []velerov1.Backup
	PVBs    []velerov1.PodVolumeBackup
	DBRs    []velerov1.DeleteBackupRequest
	// Now is when the snapshot was read.
	Now time.Time
}

// ReadSnapshot lists Velero's backups, PodVolumeBackups and DeleteBackupRequests.
func ReadSnapshot(ctx context.Context, cl *kube.Clients, now time.Time) (*Snapshot, error) {
	s := &Snapshot{Now: now}
	var err error
	if s.Backups, err = kube.ListAs[velerov1.Backup](ctx, cl.Dynamic, backupsGVR, components.VeleroNamespace, metav1.ListOptions{}); err != nil {
		return nil, veleroErr("list backups", err)
	}
	if s.PVBs, err = kube.ListAs[velerov1.PodVolumeBackup](ctx, cl.Dynamic, pvbsGVR, components.VeleroNamespace, metav1.ListOptions{}); err != nil {
		return nil, veleroErr("list pod volume backups", err)
	}
	if s.DBRs, err = kube.ListAs[velerov1.DeleteBackupRequest](ctx, cl.Dynamic, dbrsGVR, components.VeleroNamespace, metav1.ListOptions{}); err != nil {
		return nil, veleroErr("list delete backup requests", err)
	}
	return s, nil
}

// veleroErr says that Velero is missing when its API is not served.
func veleroErr(what string, err error) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: Velero's API is not served on this cluster (%v); 'kip status' shows Velero's health", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Verdict is Check for backup b, with the claims need.
func (s *Snapshot) Verdict(b *velerov1.Backup, need ...Claim) Verdict {
	return Check(Input{Backup: b, PVBs: s.PVBs, DBRs: s.DBRs, Now: s.Now, Need: need})
}

// Holds is Check for backup b judged by the claims need alone (Input.Only): whether it is a
// completed backup of the data of the service whose claims they are, whatever it lacks of the
// other volumes kip recorded when it made it.
func (s *Snapshot) Holds(b *velerov1.Backup, need ...Claim) Verdict {
	return Check(Input{Backup: b, PVBs: s.PVBs, DBRs: s.DBRs, Now: s.Now, Need: need, Only: true})
}

// Find is the backup named name.
func (s *Snapshot) Find(name string) (*velerov1.Backup, error) {
	for i := range s.Backups {
		if s.Backups[i].Name == name {
			return &s.Backups[i], nil
		}
	}
	return nil, fmt.Errorf("no backup %q: 'kip backup list' lists the cluster's backups", name)
}

// Latest is the newest completed backup that holds every namespace of namespaces and the claims
// need; without one, the error says why the newest backup holding them is not one, or that none
// holds them (the caller names the command that makes one).
func (s *Snapshot) Latest(namespaces []string, need ...Claim) (*velerov1.Backup, error) {
	return s.latest(namespaces, func(b *velerov1.Backup) Verdict { return s.Verdict(b, need...) })
}

// LatestHolding is Latest judged by the claims need alone (Holds).
func (s *Snapshot) LatestHolding(namespaces []string, need ...Claim) (*velerov1.Backup, error) {
	return s.latest(namespaces, func(b *velerov1.Backup) Verdict { return s.Holds(b, need...) })
}

func (s *Snapshot) latest(namespaces []string, verdict func(*velerov1.Backup) Verdict) (*velerov1.Backup, error) {
	if len(namespaces) == 0 {
		return nil, errors.New("no namespace to find a backup of")
	}
	var newest, newestCompleted *velerov1.Backup
	for i := range s.Backups {
		b := &s.Backups[i]
		if !holdsAll(b, namespaces) {
			continue
		}
		if newest == nil || Started(b).After(Started(newest)) {
			newest = b
		}
		if verdict(b).State == StateCompleted && (newestCompleted == nil || Started(b).After(Started(newestCompleted))) {
			newestCompleted = b
		}
	}
	switch {
	case newestCompleted != nil:
		return newestCompleted, nil
	case newest == nil:
		return nil, fmt.Errorf("no backup holds %s", joinAnd(namespaces))
	}
	return nil, fmt.Errorf("no completed backup holds %s; the newest, %w", joinAnd(namespaces), verdict(newest).Err(newest.Name))
}

// Started is when Velero started b, or when it was created before it started.
func Started(b *velerov1.Backup) time.Time {
	if b.Status.StartTimestamp != nil {
		return b.Status.StartTimestamp.Time
	}
	return b.CreationTimestamp.Time
}
