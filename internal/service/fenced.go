package service

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
)

// FenceAnnotation is on a Service that kip node fence stopped, with the fenced worker's name.
// The service stays stopped while it is there: kip service start lifts it only after the copies
// check (and consent to older data), a rejoin of the worker lifts it, and a move of the
// service's data leaves a service that carries it stopped.
const FenceAnnotation = "kipper.run/fence-stop"

// Claims are the claims of the service's volumes: its data, and its dump volume if its type has
// one.
func (s *Service) Claims() []string {
	claims := []string{s.DataClaim()}
	if d := s.DumpClaim(); d != "" {
		claims = append(claims, d)
	}
	return claims
}

// OnNode are the Kipper services among services with a volume among claims (the
// namespace/claim of each single-node volume on node), and those node's fence stopped. A service
// its operator stopped is left out: it stays stopped anyway.
func OnNode(services []*Service, claims map[string]bool, node string) []*Service {
	var out []*Service
	for _, s := range services {
		hit := slices.ContainsFunc(s.Claims(), func(c string) bool { return claims[s.Namespace()+"/"+c] })
		if hit && !s.Stopped || s.FenceStop == node {
			out = append(out, s)
		}
	}
	return out
}

// SetFenceStop stops the service for the fence of worker, recording it in FenceAnnotation.
func SetFenceStop(ctx context.Context, dyn dynamic.Interface, ref Ref, worker string) error {
	return patchSpec(ctx, dyn, ref, map[string]any{"stopped": true}, map[string]any{FenceAnnotation: worker})
}

// LiftFenceStop starts a service the fence stopped: FenceAnnotation removed and spec.stopped
// false, in one write.
func LiftFenceStop(ctx context.Context, dyn dynamic.Interface, ref Ref) error {
	return patchSpec(ctx, dyn, ref, map[string]any{"stopped": false}, map[string]any{FenceAnnotation: nil})
}

// FencedData is how the data of the service stands with worker fenced: JudgeFenced of the
// copies of its volumes, which it returns too.
func FencedData(ctx context.Context, cl *kube.Clients, s *Service, worker string, cutOff []string) (string, []longhorn.VolumeReplicas, error) {
	copies, err := longhorn.ReadReplicas(ctx, cl, s.Namespace(), s.Claims())
	if err != nil {
		return "", nil, err
	}
	return JudgeFenced(copies, worker, cutOff), copies, nil
}

// JudgeFenced is how data whose volumes have copies stands with worker fenced: longhorn.Judge,
// once the copies elsewhere of the volumes in cutOff (whose engine ran on the worker while it
// could not reach the server) are marked not known to be current (longhorn.Distrust, which
// changes copies). kip node fence, kip service start and kip status judge by it.
func JudgeFenced(copies []longhorn.VolumeReplicas, worker string, cutOff []string) string {
	longhorn.Distrust(copies, cutOff, worker)
	return longhorn.Judge(copies, worker)
}

// FencedStart is what the fence's check decides for a service without the fenced worker:
// Verdict is how its data stands (JudgeFenced), CurrentOn the nodes holding a current copy of
// every volume, and Accepted whether the operator accepted copies that may be older (a
// DataStale verdict).
type FencedStart struct {
	Verdict   string
	CurrentOn []string
	Accepted  bool
}

// DecideStart judges the copies of service s without gone (the fenced worker, or "" once it is
// back; cutOff as for FencedData) and decides whether it may start: yes when other nodes hold a
// current copy of every volume; when some hold only copies that may be older, with accept (the
// operator's --accept-stale-data) or a yes to StaleQuestion from consent, the caller's prompting
// (nil asks nothing: a dry run); never when a volume's only copy is on gone.
func DecideStart(ctx context.Context, cl *kube.Clients, s *Service, gone string, cutOff []string, accept bool, consent func(question string) (bool, error)) (FencedStart, error) {
	verdict, copies, err := FencedData(ctx, cl, s, gone, cutOff)
	if err != nil {
		return FencedStart{}, err
	}
	d := FencedStart{Verdict: verdict, CurrentOn: longhorn.CurrentOn(copies, gone)}
	if verdict == longhorn.DataStale {
		d.Accepted = accept
		if !d.Accepted && consent != nil {
			if d.Accepted, err = consent(StaleQuestion(s, gone, copies)); err != nil {
				return d, err
			}
		}
	}
	return d, nil
}

// Starts reports whether the service may start: on current copies, on older ones the operator
// accepted, never while a volume's only copy is on the fenced worker.
func (d FencedStart) Starts() bool {
	return d.Verdict != longhorn.DataOnlyThere && (d.Verdict != longhorn.DataStale || d.Accepted)
}

// FenceWhy says why the fence of worker keeps the service stopped, "" when it starts elsewhere:
// the words of kip node fence's question and report.
func (d FencedStart) FenceWhy(worker string) string {
	switch {
	case d.Starts():
		return ""
	case d.Verdict == longhorn.DataStale:
		return DataWhy(d.Verdict, worker, nil) + ", and older data was not accepted"
	}
	return DataWhy(d.Verdict, worker, nil)
}

// StartWhy says what keeps a service the fence of gone (whose host is goneHost) stopped from
// starting, "" when it may start: the words of kip service start and of a rejoin.
func (d FencedStart) StartWhy(s *Service, gone, goneHost string) string {
	switch {
	case d.Starts():
		return ""
	case d.Verdict == longhorn.DataOnlyThere:
		return OnlyThereRecipe(s, gone, goneHost)
	}
	return fmt.Sprintf("no node holds a copy of its data known to be current: to start it on copies that may be older, run %s "+
		"(kip service info shows where its data is)", AcceptStaleCommand(s.Ref))
}

// StaleQuestion asks the operator to accept the older data of the service, every copy shown
// with its timestamps.
func StaleQuestion(s *Service, gone string, copies []longhorn.VolumeReplicas) string {
	but, lost := "", ""
	if gone != "" {
		but, lost = " but "+gone, ", losing what only "+gone+" held"
	}
	return fmt.Sprintf("No node%s holds a copy of the data of service %s known to be current; the copies Longhorn keeps:\n  %s\n"+
		"Start the service on copies that may be older%s?", but, s.Ref, strings.Join(longhorn.Describe(copies), "\n  "), lost)
}

// DataWhy says how the data of a service stands without worker, by longhorn.Judge's verdict and
// the nodes holding a current copy of every volume: the words kip node fence, kip service start
// and kip status share.
func DataWhy(verdict, worker string, currentOn []string) string {
	switch {
	case verdict == longhorn.DataOnlyThere:
		return "its only copy of some volume is on " + worker
	case verdict == longhorn.DataCurrent && len(currentOn) > 0:
		return "current copies of its data are on " + strings.Join(currentOn, ", ")
	}
	return "no node but " + worker + " holds a copy of its data known to be current"
}

// AcceptStaleCommand is the command that starts service r, which a fence stopped, on copies of
// its data that may be older.
func AcceptStaleCommand(r Ref) string {
	return "kip service start " + r.Flags() + " --accept-stale-data"
}

// RejoinCommand is the command that rejoins a worker at host, "" when kip keeps no record of it.
func RejoinCommand(host string) string {
	if host == "" {
		host = "HOST"
	}
	return "kip node add " + host
}

// OnlyThereRecipe says how to bring back a service whose only copy is on a worker, whose host is
// host (see RejoinCommand): rejoin it, or when it is lost, delete the service and restore it from
// a backup taken before the fence, while it ran.
func OnlyThereRecipe(s *Service, worker, host string) string {
	return fmt.Sprintf("%s, so it stays stopped until %s rejoins (%s); if %s is lost, "+
		"delete the service with 'kip service delete %s --delete-data' and restore it with 'kip backup restore <backup> --namespace %s', "+
		"using a backup taken before the fence while the service ran ('kip backup list --project %s'): the restore brings back what is missing there "+
		"and skips the objects that still exist, after listing them and asking (--yes answers), and a later backup holds none of its files", DataWhy(longhorn.DataOnlyThere, worker, nil), worker, RejoinCommand(host), worker, s.Flags(), s.Namespace(), s.Project)
}

// startFenced lifts the fence's stop from a service kip node fence stopped, after DecideStart's
// check: with the worker still fenced (or gone), judged without it; once it rejoined (no fence
// in kip's record, which a rejoin lifts last, and its node Ready), with every node.
func (o *ServiceOptions) startFenced(ctx context.Context, cl *kube.Clients, s *Service) error {
	gone := s.FenceStop
	workers, err := cluster.ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		return err
	}
	w := workers.Workers[gone]
	n, err := cl.Kube.CoreV1().Nodes().Get(ctx, gone, metav1.GetOptions{})
	switch {
	case err == nil && w.Fence == nil && cluster.NodeStatus(n) == cluster.NodeReady:
		gone = ""
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("read node %s: %w", gone, err)
	}
	var cutOff []string
	if gone != "" && w.Fence != nil {
		cutOff = w.Fence.CutOff
	}
	d, err := DecideStart(ctx, cl, s, gone, cutOff, o.AcceptStale, o.Prompter.Consent)
	if err != nil {
		return err
	}
	if why := d.StartWhy(s, gone, w.Host); why != "" {
		return fmt.Errorf("kip node fence of %s stopped service %s, and %s", s.FenceStop, s.Ref, why)
	}
	return LiftFenceStop(ctx, cl.Dynamic, s.Ref)
}
