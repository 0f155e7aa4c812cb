package prune

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/clock"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// Options is kip cluster storage prune [NAME --project P [--environment E]] [--now]
// [--delete-unproven].
type Options struct {
	Kube     func() (*kube.Clients, error)
	Printer  *cli.Printer
	Prompter *cli.Prompter
	// Holder names this kip run in the cluster lock.
	Holder     string
	KipVersion string
	// Name, Project and Environment pick one service's copy; all empty for every copy.
	Name, Project, Environment string
	Waivers
	// Server is the server's SSH address as saved for the cluster; "" falls back to the address
	// the cluster record names.
	Server string
	// Remove runs RemoveCommand(dir) on host, over SSH; Present runs PresentCommand(dir) there
	// and reports whether it found dir.
	Remove  func(ctx context.Context, host, dir string) error
	Present func(ctx context.Context, host, dir string) (bool, error)
	// Clock is the time, clock.Now when nil; tests pin it.
	Clock func() time.Time
}

func (o *Options) now() time.Time {
	if o.Clock != nil {
		return o.Clock()
	}
	return clock.Now()
}

// Validate refuses flags that do not go together, before anything is read.
func (o *Options) Validate() error {
	switch {
	case o.Name == "" && (o.Project != "" || o.Environment != ""):
		return errors.New("--project and --environment pick one service's copy: name the service too (kip cluster storage prune NAME --project P)")
	case o.Name != "" && o.Project == "":
		return fmt.Errorf("name the project of service %s with --project (kip cluster storage prune %s --project P)", o.Name, o.Name)
	case o.Unproven && o.Name == "":
		return errors.New("--delete-unproven waives the health check for one copy only: name its service (kip cluster storage prune NAME --project P --delete-unproven)")
	}
	return nil
}

// Run lists the kept copies, asks once, and deletes each one that may go, checking it again
// right before.
func Run(ctx context.Context, o *Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	rec, err := cluster.ReadInstalled(ctx, cl.Dynamic)
	if err != nil {
		return err
	}
	all, err := Read(ctx, cl, rec, o.now())
	if err != nil {
		return err
	}
	copies, err := o.pick(all)
	if err != nil {
		return err
	}
	for i := range copies {
		if err := o.started(ctx, rec, &copies[i]); err != nil {
			return err
		}
	}
	var del, kept []Kept
	for _, c := range copies {
		if c.Deletable(o.Waivers) {
			del = append(del, c)
		} else {
			kept = append(kept, c)
		}
	}
	o.list(del, kept)
	if len(del) == 0 {
		o.Printer.StepAlready("No local copy to delete")
		return nil
	}
	ok, err := o.Prompter.Confirm(fmt.Sprintf("Delete %s? This cannot be undone.", cli.Count(len(del), "local copy", "local copies")))
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("cancelled: nothing was deleted")
	}
	p := &pruner{o: o, cl: cl, rec: rec, copies: del, kept: map[string]string{}}
	r := &workflow.Runner{Lock: workflow.ClusterLock(cl.Kube, kube.LockOptions{}), Holder: kube.HolderText(o.Holder),
		KipVersion: o.KipVersion, Report: o.Printer}
	steps := []workflow.Step{{Name: "delete", Title: "Delete " + cli.Count(len(del), "local copy", "local copies"),
		Done: "Went through the copies", Already: "No local copy left to delete", Check: p.done, Apply: p.deleteAll}}
	if err := r.Run(ctx, &workflow.Workflow{Name: "cluster-storage-prune", Steps: steps}); err != nil {
		return err
	}
	if len(p.kept) > 0 {
		var why []string
		for _, c := range del {
			if r, ok := p.kept[c.Volume]; ok {
				why = append(why, c.What()+": "+r)
			}
		}
		return fmt.Errorf("kept %s whose conditions changed since the listing: %s; 'kip status' shows when they will hold",
			cli.Count(len(why), "copy", "copies"), strings.Join(why, "; "))
	}
	return nil
}

// started finds out, for a copy a prune marked and did not finish, whether its deletion began on
// the host: then its directory is gone from its path (RemoveCommand renames it first), it may be
// partly gone, and it is finished without checks. While the directory is there, the copy is
// judged as any other.
func (o *Options) started(ctx context.Context, rec cluster.Record, c *Kept) error {
	if !c.DeleteStarted {
		return nil
	}
	host, err := rec.ServerHost(o.Server)
	if err != nil {
		return err
	}
	present, err := o.Present(ctx, host, c.Path)
	if err != nil {
		return fmt.Errorf("look for %s on %s, which an earlier prune was deleting: %w", c.Path, c.Node, err)
	}
	if !present {
		c.Kind, c.Holds = KindInterrupted, nil
	}
	return nil
}

// RemoveCommand deletes dir on its host: it renames dir first, in one step, so that a deletion
// that began shows on the host (dir gone from its path) however far it got, then deletes the
// renamed directory; run again, it finishes what is left. rm -rf fails when anything is left.
func RemoveCommand(dir string) string {
	doomed := dir + ".kip-prune"
	return "if [ -e " + sshx.Quote(dir) + " ]; then " + sshx.Command("mv", "-T", "--", dir, doomed) + "; fi && " + sshx.Command("rm", "-rf", "--", doomed)
}

// PresentCommand prints "present" when dir is there (a directory or anything else).
func PresentCommand(dir string) string {
	return "if [ -e " + sshx.Quote(dir) + " ]; then echo present; fi"
}

// pick narrows the copies to the named service's, refusing a name that matches none or several
// environments.
func (o *Options) pick(all []Kept) ([]Kept, error) {
	if o.Name == "" {
		return all, nil
	}
	var out []Kept
	envs := map[string]bool{}
	for _, c := range all {
		if c.Of(o.Name, o.Project, o.Environment) {
			out = append(out, c)
			envs[c.Service.Environment] = true
		}
	}
	switch {
	case len(out) == 0:
		where := "project " + o.Project
		if o.Environment != "" {
			where += ", environment " + o.Environment
		}
		return nil, fmt.Errorf("no local copy of service %s in %s is kept: 'kip status' lists the kept copies", o.Name, where)
	case len(envs) > 1:
		return nil, fmt.Errorf("service %s has kept copies in several environments of project %s (%s): pick one with --environment", o.Name, o.Project, strings.Join(slices.Sorted(maps.Keys(envs)), ", "))
	}
	return out, nil
}

// list prints what the prune would delete, the orphans and interrupted deletions apart, and
// what it keeps with why.
func (o *Options) list(del, kept []Kept) {
	var copies, orphans, interrupted []Kept
	for _, c := range del {
		switch c.Kind {
		case KindOrphan:
			orphans = append(orphans, c)
		case KindInterrupted:
			interrupted = append(interrupted, c)
		default:
			copies = append(copies, c)
		}
	}
	section := func(title string, cs []Kept) {
		if len(cs) == 0 {
			return
		}
		o.Printer.Info(title)
		for _, c := range cs {
			o.Printer.Info("  " + Line(c))
		}
	}
	section("To delete, every condition met:", copies)
	section("To delete without checks, their service and data claim both gone:", orphans)
	section("To finish deleting, an earlier prune started and was interrupted:", interrupted)
	if len(kept) > 0 {
		o.Printer.Info("Kept:")
		for _, c := range kept {
			o.Printer.Info("  " + Line(c))
			for _, h := range c.Holds {
				if !o.Waivers.waives(h) {
					o.Printer.Info("    " + h.Reason)
				}
			}
		}
	}
}

// Line describes a copy on one line: whose, which volume, where, how large.
func Line(c Kept) string {
	size := cli.FormatBytes(c.SizeBytes) + " declared"
	if c.UsedBytes != nil {
		size = cli.FormatBytes(*c.UsedBytes)
	}
	return fmt.Sprintf("%s: volume %s, %s on %s (%s)", c.What(), c.Volume, c.Path, c.Node, size)
}

// pruner deletes the agreed copies under the cluster lock.
type pruner struct {
	o      *Options
	cl     *kube.Clients
	rec    cluster.Record
	copies []Kept
	// kept are the copies this run did not delete after all, with why.
	kept map[string]string
}

func (p *pruner) done(ctx context.Context) (bool, error) {
	for _, c := range p.copies {
		if _, kept := p.kept[c.Volume]; kept {
			continue
		}
		// A volume being deleted counts as gone: its directory is, and Kubernetes lifts its
		// protection finalizer on its own.
		if pv, err := p.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, c.Volume, metav1.GetOptions{}); err == nil && pv.DeletionTimestamp == nil {
			return false, nil
		} else if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
	}
	return true, nil
}

func (p *pruner) deleteAll(ctx context.Context) error {
	for _, agreed := range p.copies {
		c, found, err := One(ctx, p.cl, p.rec, p.o.now(), agreed.Volume)
		if err == nil && found {
			err = p.o.started(ctx, p.rec, &c)
		}
		switch {
		case err != nil:
			return err
		case !found:
			continue // deleted meanwhile
		// Listed as an orphan or an interrupted deletion, a copy that is now neither (its service
		// or claim came back) is kept too: its checks were never shown.
		case !c.Deletable(p.o.Waivers) || (c.Kind == KindMoved && agreed.Kind != KindMoved):
			p.keep(c)
			continue
		}
		if err := p.delete(ctx, c); err != nil {
			return err
		}
		p.o.Printer.Success("Deleted the local copy of " + c.What() + " (volume " + c.Volume + ", " + c.Path + " on " + c.Node + ")")
	}
	return nil
}

// keep records why a copy agreed to is kept after all.
func (p *pruner) keep(c Kept) {
	var why []string
	for _, h := range c.Holds {
		if !p.o.Waivers.waives(h) {
			why = append(why, h.Reason)
		}
	}
	if len(why) == 0 {
		why = append(why, "its service or claim is back")
	}
	p.kept[c.Volume] = strings.Join(why, "; ")
	p.o.Printer.Warn("Kept the local copy of " + c.What() + ": " + p.kept[c.Volume])
}

// delete marks the copy's deletion as started, deletes its directory on its node
// (RemoveCommand), then its PersistentVolume: an interrupted delete leaves the mark, and the
// next prune finishes it when the directory's deletion began (Options.started).
func (p *pruner) delete(ctx context.Context, c Kept) error {
	if err := removable(c); err != nil {
		return err
	}
	pvs := p.cl.Kube.CoreV1().PersistentVolumes()
	pv, err := pvs.Get(ctx, c.Volume, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read volume %s: %w", c.Volume, err)
	}
	if err := p.onServer(ctx, c.Node); err != nil {
		return err
	}
	host, err := p.rec.ServerHost(p.o.Server)
	if err != nil {
		return err
	}
	if pv.Annotations[StartedAnnotation] == "" {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{StartedAnnotation: p.o.now().UTC().Format(time.RFC3339)}}})
		if _, err := pvs.Patch(ctx, c.Volume, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: kube.FieldManager}); err != nil {
			return fmt.Errorf("mark volume %s as being deleted: %w", c.Volume, err)
		}
	}
	if err := p.o.Remove(ctx, host, c.Path); err != nil {
		return fmt.Errorf("delete %s on %s: %w; run 'kip cluster storage prune' again: it finishes the deletion if it began, and otherwise checks the copy again", c.Path, c.Node, err)
	}
	uid := pv.UID
	if err := pvs.Delete(ctx, c.Volume, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete volume %s (its directory is gone): %w", c.Volume, err)
	}
	return nil
}

// onServer refuses a copy on a node that is not a server: kip reaches only the server over SSH.
func (p *pruner) onServer(ctx context.Context, node string) error {
	n, err := p.cl.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s, which holds the copy: %w", node, err)
	}
	if cluster.NodeRole(n) != cluster.RoleServer {
		return fmt.Errorf("the copy is on node %s, which is not the server: kip reaches only the server over SSH; delete it there by hand", node)
	}
	return nil
}
