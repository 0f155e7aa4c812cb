package backup

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
)

// Summary is one backup in kip backup list -o json: Velero's view (phase, counts, times) and
// kip's (Verdict: whether it is a completed backup, and why not).
type Summary struct {
	Name       string     `json:"name"`
	Project    string     `json:"project,omitempty"`
	Namespaces []string   `json:"namespaces"`
	Phase      string     `json:"phase"`
	Verdict    Verdict    `json:"verdict"`
	Errors     int        `json:"errors"`
	Warnings   int        `json:"warnings"`
	Started    *time.Time `json:"started,omitempty"`
	Completed  *time.Time `json:"completed,omitempty"`
	Expires    *time.Time `json:"expires,omitempty"`
}

// Description is kip backup describe -o json: the summary, why Velero failed it, its progress
// and hooks, a deletion in progress, and what it holds per namespace and per volume.
type Description struct {
	Summary
	FailureReason    string          `json:"failureReason,omitempty"`
	ValidationErrors []string        `json:"validationErrors,omitempty"`
	ItemsBackedUp    int             `json:"itemsBackedUp"`
	TotalItems       int             `json:"totalItems"`
	HooksAttempted   int             `json:"hooksAttempted"`
	HooksFailed      int             `json:"hooksFailed"`
	Deletion         *Deletion       `json:"deletion,omitempty"`
	ByNamespace      []NamespaceData `json:"byNamespace"`
}

// NamespaceData is what a backup holds of one namespace's volumes: each file-system backup, and
// the claims kip recorded that have none.
type NamespaceData struct {
	Namespace string         `json:"namespace"`
	Volumes   []VolumeBackup `json:"volumes"`
	// Missing are claims kip recorded for this backup that no PodVolumeBackup holds.
	Missing []string `json:"missing,omitempty"`
}

// VolumeBackup is one PodVolumeBackup.
type VolumeBackup struct {
	Claim   string `json:"claim,omitempty"`
	Pod     string `json:"pod"`
	Volume  string `json:"volume"`
	Node    string `json:"node,omitempty"`
	Phase   string `json:"phase"`
	Bytes   int64  `json:"bytes"`
	Message string `json:"message,omitempty"`
}

// Deletion is a DeleteBackupRequest for the backup.
type Deletion struct {
	Request string   `json:"request"`
	Phase   string   `json:"phase"`
	Errors  []string `json:"errors,omitempty"`
}

// ListOptions are kip backup list's.
type ListOptions struct {
	Options
	Project string
}

// List prints the backups, newest first; with a project, those holding any of its namespaces.
func List(ctx context.Context, o *ListOptions) error {
	e, err := load(ctx, &o.Options)
	if err != nil {
		return err
	}
	var projectNS []string
	if o.Project != "" {
		if projectNS, err = ProjectNamespaces(ctx, e.cl, o.Project); err != nil {
			return err
		}
	}
	s, err := ReadSnapshot(ctx, e.cl, o.now())
	if err != nil {
		return err
	}
	out := []Summary{}
	backups := slices.Clone(s.Backups)
	sort.SliceStable(backups, func(i, j int) bool { return Started(&backups[i]).After(Started(&backups[j])) })
	for i := range backups {
		b := &backups[i]
		if o.Project != "" && b.Labels[ProjectLabel] != o.Project && !slices.ContainsFunc(projectNS, func(ns string) bool { return holds(b, ns) }) {
			continue
		}
		out = append(out, s.summary(b))
	}
	if o.JSON {
		return cli.WriteJSON(o.Out, out)
	}
	rows := make([][]string, 0, len(out))
	for _, b := range out {
		rows = append(rows, []string{b.Name, verdictWord(b.Verdict), b.Phase, when(b.Started), when(b.Expires),
			strconv.Itoa(b.Errors), strconv.Itoa(b.Warnings), strings.Join(b.Namespaces, ",")})
	}
	cli.WriteTable(o.Out, "Backups", "none: 'kip backup create --wait' makes one",
		[]string{"NAME", "KIP", "PHASE", "STARTED", "EXPIRES", "ERRORS", "WARNINGS", "NAMESPACES"}, rows)
	return nil
}

// DescribeOptions are kip backup describe's.
type DescribeOptions struct {
	Options
	Name string
}

// Describe prints one backup in full.
func Describe(ctx context.Context, o *DescribeOptions) error {
	_, s, b, err := loadBackup(ctx, &o.Options, o.Name)
	if err != nil {
		return err
	}
	d, err := s.describe(b)
	if err != nil {
		return err
	}
	if o.JSON {
		return cli.WriteJSON(o.Out, d)
	}
	writeDescription(o.Out, d)
	return nil
}

func (s *Snapshot) summary(b *velerov1.Backup) Summary {
	ns := b.Spec.IncludedNamespaces
	if len(ns) == 0 {
		ns = []string{"*"}
	}
	return Summary{
		Name: b.Name, Project: b.Labels[ProjectLabel], Namespaces: ns, Phase: orNew(string(b.Status.Phase)),
		Verdict: s.Verdict(b), Errors: b.Status.Errors, Warnings: b.Status.Warnings,
		Started: timeOf(b.Status.StartTimestamp), Completed: timeOf(b.Status.CompletionTimestamp), Expires: timeOf(b.Status.Expiration),
	}
}

func (s *Snapshot) describe(b *velerov1.Backup) (Description, error) {
	d := Description{Summary: s.summary(b), FailureReason: b.Status.FailureReason, ValidationErrors: b.Status.ValidationErrors}
	if p := b.Status.Progress; p != nil {
		d.ItemsBackedUp, d.TotalItems = p.ItemsBackedUp, p.TotalItems
	}
	if h := b.Status.HookStatus; h != nil {
		d.HooksAttempted, d.HooksFailed = h.HooksAttempted, h.HooksFailed
	}
	for _, r := range s.DBRs {
		if dbrFor(&r, b) {
			d.Deletion = &Deletion{Request: r.Name, Phase: orNew(string(r.Status.Phase)), Errors: r.Status.Errors}
		}
	}
	byNS := map[string]*NamespaceData{}
	entry := func(ns string) *NamespaceData {
		if byNS[ns] == nil {
			byNS[ns] = &NamespaceData{Namespace: ns, Volumes: []VolumeBackup{}}
		}
		return byNS[ns]
	}
	for _, ns := range b.Spec.IncludedNamespaces {
		entry(ns)
	}
	own := BackupPVBs(b, s.PVBs)
	for i := range own {
		p := &own[i]
		entry(p.Spec.Pod.Namespace).Volumes = append(entry(p.Spec.Pod.Namespace).Volumes, VolumeBackup{
			Claim: pvbClaim(p).Name, Pod: p.Spec.Pod.Name, Volume: p.Spec.Volume, Node: p.Spec.Node,
			Phase: orNew(string(p.Status.Phase)), Bytes: p.Status.Progress.TotalBytes, Message: p.Status.Message,
		})
	}
	claims, _, err := RecordedClaims(b)
	if err != nil {
		return d, err
	}
	for _, c := range claims {
		if findPVB(own, c) == nil {
			entry(c.Namespace).Missing = append(entry(c.Namespace).Missing, c.Name)
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		d.ByNamespace = append(d.ByNamespace, *byNS[ns])
	}
	return d, nil
}

func writeDescription(w io.Writer, d Description) {
	fmt.Fprintf(w, "Name:        %s\n", d.Name)
	fmt.Fprintf(w, "Completed backup: %s\n", verdictWord(d.Verdict))
	for _, r := range d.Verdict.Reasons {
		fmt.Fprintf(w, "  - %s\n", r)
	}
	fmt.Fprintf(w, "Phase:       %s\n", d.Phase)
	if d.FailureReason != "" {
		fmt.Fprintf(w, "Failure:     %s\n", d.FailureReason)
	}
	for _, v := range d.ValidationErrors {
		fmt.Fprintf(w, "Invalid:     %s\n", v)
	}
	if d.Project != "" {
		fmt.Fprintf(w, "Project:     %s\n", d.Project)
	}
	fmt.Fprintf(w, "Namespaces:  %s\n", strings.Join(d.Namespaces, ", "))
	fmt.Fprintf(w, "Started:     %s\n", when(d.Started))
	fmt.Fprintf(w, "Finished:    %s\n", when(d.Completed))
	fmt.Fprintf(w, "Expires:     %s\n", when(d.Expires))
	fmt.Fprintf(w, "Items:       %d of %d backed up\n", d.ItemsBackedUp, d.TotalItems)
	fmt.Fprintf(w, "Errors:      %d\nWarnings:    %d\n", d.Errors, d.Warnings)
	if d.HooksAttempted > 0 {
		fmt.Fprintf(w, "Hooks:       %d run, %d failed\n", d.HooksAttempted, d.HooksFailed)
	}
	if d.Deletion != nil {
		fmt.Fprintf(w, "Deletion:    %s (%s)\n", d.Deletion.Request, d.Deletion.Phase)
	}
	for _, ns := range d.ByNamespace {
		rows := make([][]string, 0, len(ns.Volumes)+len(ns.Missing))
		for _, v := range ns.Volumes {
			rows = append(rows, []string{cli.OrDash(v.Claim), v.Pod + "/" + v.Volume, v.Phase, strconv.FormatInt(v.Bytes, 10), cli.OrDash(v.Message)})
		}
		for _, m := range ns.Missing {
			rows = append(rows, []string{m, "-", "no file-system backup", "0", "its pod was not Running, or Velero skipped it"})
		}
		cli.WriteTable(w, "Namespace "+ns.Namespace, "no volumes", []string{"CLAIM", "POD/VOLUME", "PHASE", "BYTES", "MESSAGE"}, rows)
	}
}

func verdictWord(v Verdict) string {
	switch v.State {
	case StateCompleted:
		return "yes"
	case StateWaiting:
		return "not yet"
	}
	return "no"
}

func timeOf(t *metav1.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}
