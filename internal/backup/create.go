package backup

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
)

// DefaultTTL is how long a backup is kept unless --ttl says otherwise: 30 days.
const DefaultTTL = 720 * time.Hour

// WaitTimeout bounds kip backup create --wait: Velero's own limit on a file-system backup.
const WaitTimeout = 4 * time.Hour

// Labels kip puts on the backups it creates.
const (
	// ProjectLabel names the project of a backup made with --project.
	ProjectLabel = "kipper.run/project"
	// CreatedByAnnotation is the command line that created the backup.
	CreatedByAnnotation = "kipper.run/created-by"
)

// CreateOptions are kip backup create's.
type CreateOptions struct {
	Options
	Project    string
	Namespaces []string
	TTL        time.Duration
	Wait       bool
	// Holder is the command line, recorded on the backup.
	Holder string
}

// Create starts a backup of the scope and, with Wait, waits until it finishes and is a completed
// backup. It returns the backup's name once Velero has it.
func Create(ctx context.Context, o *CreateOptions) (string, error) {
	e, err := load(ctx, &o.Options)
	if err != nil {
		return "", err
	}
	b, err := e.create(ctx, o)
	if err != nil {
		return "", err
	}
	if o.Wait {
		_, err = e.wait(ctx, b)
	}
	return b.Name, err
}

// create creates the Backup object, with kip's record of the claims it should hold.
func (e *env) create(ctx context.Context, o *CreateOptions) (*velerov1.Backup, error) {
	ttl := o.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < time.Hour {
		return nil, cli.Usagef("--ttl %s is too short: a backup is kept at least an hour (Velero deletes expired backups hourly)", ttl)
	}
	scope, err := resolveScope(ctx, e.cl, o.Project, o.Namespaces)
	if err != nil {
		return nil, err
	}
	c, err := takeCensus(ctx, e.cl, scope.Namespaces)
	if err != nil {
		return nil, err
	}
	for _, s := range c.Skipped {
		e.o.Printer.Warn("Velero will hold no data for this volume, so this backup will not be a completed backup: " + s + "; start the service and back up again")
	}
	for _, claim := range c.Unsupported {
		e.o.Printer.Warn("Velero cannot back up the files of claim " + claim + ": its volume is a hostPath volume; the backup holds the claim, not its data")
	}
	key, claims, err := kube.RecordAnnotation(volumesRecord, volumesRecordVersion, VolumesRecord{Claims: c.Claims})
	if err != nil {
		return nil, err
	}
	b := &velerov1.Backup{
		TypeMeta: metav1.TypeMeta{APIVersion: velerov1.SchemeGroupVersion.String(), Kind: "Backup"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        backupName(scope, e.o.now()),
			Namespace:   components.VeleroNamespace,
			Annotations: map[string]string{key: claims, CreatedByAnnotation: o.Holder},
		},
		Spec: velerov1.BackupSpec{
			IncludedNamespaces:       scope.Namespaces,
			TTL:                      metav1.Duration{Duration: ttl},
			DefaultVolumesToFsBackup: ptr.To(true),
		},
	}
	if scope.Project != "" {
		b.Labels = map[string]string{ProjectLabel: scope.Project}
	}
	created, err := kube.CreateAs(ctx, e.cl.Dynamic, backupsGVR, components.VeleroNamespace, b)
	if err != nil {
		return nil, veleroErr("create backup", err)
	}
	e.o.Printer.Success(fmt.Sprintf("Started backup %s of %s (%s, kept %s)", created.Name, joinAnd(scope.Namespaces),
		cli.Count(len(c.Claims), "volume", "volumes"), keptFor(ttl)))
	return created, nil
}

// keptFor says how long a backup is kept: in days when it is whole days.
func keptFor(ttl time.Duration) string {
	if ttl%(24*time.Hour) == 0 {
		return cli.Count(int(ttl/(24*time.Hour)), "day", "days")
	}
	return ttl.String()
}

// backupName is <scope>-<UTC time to the second>: the project, the namespace, "namespaces" for
// several, or "kipper" for every project's.
func backupName(s Scope, now time.Time) string {
	prefix := "kipper"
	switch {
	case s.Project != "":
		prefix = s.Project
	case len(s.Namespaces) == 1:
		prefix = s.Namespaces[0]
	}
	if len(prefix) > 40 {
		prefix = strings.TrimRight(prefix[:40], "-")
	}
	return prefix + "-" + now.UTC().Format("20060102-150405")
}

// wait waits until b finishes, saying how far it got whenever that changes, and returns the
// verdict; an error unless it is a completed backup.
func (e *env) wait(ctx context.Context, b *velerov1.Backup) (Verdict, error) {
	p := e.o.Printer
	p.StepStarted("Waiting for backup " + b.Name)
	start := time.Now()
	// One read of the backup per poll; the PodVolumeBackups and deletion requests Check also
	// reads are listed once, when Velero has finished it.
	var last string
	err := kube.Poll(ctx, WaitTimeout, "backup "+b.Name, func(ctx context.Context) (bool, string, error) {
		cur, err := kube.GetAs[velerov1.Backup](ctx, e.cl.Dynamic, backupsGVR, components.VeleroNamespace, b.Name)
		if apierrors.IsNotFound(err) {
			return false, "", fmt.Errorf("backup %s is gone: it was deleted while kip waited", b.Name)
		}
		if err != nil {
			return false, "", err
		}
		if !slices.Contains(waitingPhases, cur.Status.Phase) {
			return true, "", nil
		}
		if msg := waitingText(cur); msg != last {
			last = msg
			p.Info(b.Name + ": " + msg)
		}
		return false, last, nil
	})
	var v Verdict
	if err == nil {
		var s *Snapshot
		if s, err = ReadSnapshot(ctx, e.cl, e.o.now()); err == nil {
			var cur *velerov1.Backup
			if cur, err = s.Find(b.Name); err == nil {
				v = s.Verdict(cur)
			}
		}
	}
	if err != nil {
		p.StepFailed("Backup "+b.Name, err)
		if ctx.Err() != nil {
			return v, fmt.Errorf("%w (the backup goes on in Velero: 'kip backup describe %s' shows it)", err, b.Name)
		}
		return v, err
	}
	if err := v.Err(b.Name); err != nil {
		p.StepFailed("Backup "+b.Name, err)
		return v, err
	}
	p.StepDone("Backup "+b.Name+" completed", time.Since(start))
	return v, nil
}
