package backup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
)

// ErrDrillOnNano is kip backup drill's refusal on the nano profile, with the spec's reason and
// its alternative.
var ErrDrillOnNano = errors.New("kip backup drill does not run on the nano profile: running a second copy of a namespace's services " +
	"exceeds a small server's memory. To check one Postgres service's backup, restore its database dump with " +
	"kip service restore-dump; to check a whole namespace, restore a backup onto a separate recovery cluster")

// DrillOfLabel marks a namespace kip backup drill created, naming the namespace it copies; a
// later drill of that namespace removes a copy an interrupted drill left.
const DrillOfLabel = "kipper.run/drill-of"

// Drill timeouts: the copy's workloads to become Ready, and the copy to be removed.
const (
	DrillReadyTimeout  = 15 * time.Minute
	DrillRemoveTimeout = 10 * time.Minute
)

// DrillOptions are kip backup drill's.
type DrillOptions struct {
	Options
	Namespace string
}

// DrillReport is what a drill found (-o json).
type DrillReport struct {
	Namespace string   `json:"namespace"`
	Backup    string   `json:"backup"`
	Copy      string   `json:"copy"`
	Ready     []string `json:"ready"`
	NotReady  []string `json:"notReady,omitempty"`
	Removed   bool     `json:"removed"`
}

// Drill restores the namespace's latest completed backup beside it, waits for the copy's
// workloads to be Ready, reports, and removes the copy, also when they do not become Ready.
func Drill(ctx context.Context, o *DrillOptions) error {
	e, err := load(ctx, &o.Options)
	if err != nil {
		return err
	}
	if e.rec.Profile == cluster.ProfileNano {
		return ErrDrillOnNano
	}
	s, err := ReadSnapshot(ctx, e.cl, o.now())
	if err != nil {
		return err
	}
	b, err := s.Latest([]string{o.Namespace})
	if err != nil {
		return fmt.Errorf("%w: back it up with 'kip backup create --namespace %s --wait' first", err, o.Namespace)
	}
	copyNS := drillCopyName(o.Namespace)
	if err := e.clearCopy(ctx, o.Namespace, copyNS); err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: copyNS, Labels: map[string]string{DrillOfLabel: o.Namespace}}}
	if _, err := e.cl.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the drill's namespace %s: %w", copyNS, err)
	}
	rep := DrillReport{Namespace: o.Namespace, Backup: b.Name, Copy: copyNS}
	drillErr := e.drill(ctx, b, o.Namespace, copyNS, &rep)
	// The copy goes whatever happened: it runs a second copy of the namespace's services.
	rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DrillRemoveTimeout)
	defer cancel()
	if err := e.removeCopy(rmCtx, copyNS); err != nil {
		return errors.Join(drillErr, err)
	}
	rep.Removed = true
	e.o.Printer.Success("Removed the drill's copy " + copyNS)
	if o.JSON {
		if err := cli.WriteJSON(o.Out, rep); err != nil {
			return err
		}
	}
	return drillErr
}

func (e *env) drill(ctx context.Context, b *velerov1.Backup, ns, copyNS string, rep *DrillReport) error {
	backup := b.Name
	if _, err := e.restore(ctx, b, []string{ns}, map[string]string{ns: copyNS}); err != nil {
		return err
	}
	p := e.o.Printer
	p.StepStarted("Waiting for the services in " + copyNS + " to be Ready")
	start := time.Now()
	err := kube.PollPending(ctx, DrillReadyTimeout, "the services in "+copyNS, func(ctx context.Context) (string, error) {
		ready, notReady, err := e.workloads(ctx, copyNS)
		rep.Ready, rep.NotReady = ready, notReady
		return strings.Join(notReady, "; "), err
	})
	if err != nil {
		p.StepFailed("Drill of "+ns, err)
		return fmt.Errorf("drill of %s from backup %s: %w", ns, backup, err)
	}
	if len(rep.Ready) == 0 {
		p.Warn(fmt.Sprintf("Backup %s holds no workloads of %s: the drill restored its objects but had nothing to run", backup, ns))
	}
	p.StepDone(fmt.Sprintf("Drill of %s: backup %s restored as %s, %d workloads Ready (%s)", ns, backup, copyNS,
		len(rep.Ready), strings.Join(rep.Ready, ", ")), time.Since(start))
	return nil
}

// workloads are the copy's Deployments, StatefulSets and DaemonSets, Ready or not (with why).
func (e *env) workloads(ctx context.Context, ns string) (ready, notReady []string, err error) {
	apps := e.cl.Kube.AppsV1()
	deps, err := apps.Deployments(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	sts, err := apps.StatefulSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	dss, err := apps.DaemonSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	add := func(name string, done bool, pending string, err error) {
		switch {
		case err != nil:
			notReady = append(notReady, name+": "+err.Error())
		case done:
			ready = append(ready, name)
		default:
			notReady = append(notReady, pending)
		}
	}
	for i := range deps.Items {
		done, pending, err := kube.RolloutStatus(&deps.Items[i])
		add("deployment "+deps.Items[i].Name, done, pending, err)
	}
	for i := range sts.Items {
		done, pending, err := kube.RolloutStatus(&sts.Items[i])
		add("statefulset "+sts.Items[i].Name, done, pending, err)
	}
	for i := range dss.Items {
		done, pending, err := kube.RolloutStatus(&dss.Items[i])
		add("daemonset "+dss.Items[i].Name, done, pending, err)
	}
	sort.Strings(ready)
	sort.Strings(notReady)
	return ready, notReady, nil
}

// drillCopyName is <namespace>-drill, within the 63 characters of a namespace name.
func drillCopyName(ns string) string {
	const suffix = "-drill"
	if len(ns)+len(suffix) > 63 {
		ns = strings.TrimRight(ns[:63-len(suffix)], "-")
	}
	return ns + suffix
}

// clearCopy removes a copy an interrupted drill of ns left, and refuses a namespace of that name
// that is not one.
func (e *env) clearCopy(ctx context.Context, ns, copyNS string) error {
	got, err := e.cl.Kube.CoreV1().Namespaces().Get(ctx, copyNS, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read namespace %s: %w", copyNS, err)
	}
	if got.Labels[DrillOfLabel] != ns {
		return fmt.Errorf("namespace %s exists and is not a drill copy of %s (no %s=%s label): kip backup drill restores into it, so rename or remove it first", copyNS, ns, DrillOfLabel, ns)
	}
	e.o.Printer.Info("Removing the copy " + copyNS + " an earlier drill left")
	return e.removeCopy(ctx, copyNS)
}

// removeCopy deletes the copy's namespace and waits until it is gone.
func (e *env) removeCopy(ctx context.Context, copyNS string) error {
	nss := e.cl.Kube.CoreV1().Namespaces()
	if err := nss.Delete(ctx, copyNS, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the drill's copy %s: %w", copyNS, err)
	}
	return kube.PollPending(ctx, DrillRemoveTimeout, "namespace "+copyNS+" to be removed", func(ctx context.Context) (string, error) {
		_, err := nss.Get(ctx, copyNS, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		return "namespace " + copyNS + " is terminating", nil
	})
}
