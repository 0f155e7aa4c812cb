package service

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/moveguard"
	"kipper.run/kip/internal/workflow"
)

// Options is what every kip service and kip project command needs; cmd/kip fills it.
type Options struct {
	Kube     func() (*kube.Clients, error)
	Printer  *cli.Printer
	Prompter *cli.Prompter
	JSON     bool
	Out      io.Writer
}

// MoveWorkflowPrefix starts the name of the progress record of a move of a service's data to
// Longhorn, and of its rollback's.
const MoveWorkflowPrefix = "service-storage-longhorn-"

// MoveWorkflow is the name of the progress record of a move of ref's data to Longhorn; its
// rollback's adds "-rollback".
func MoveWorkflow(ref Ref) string { return MoveWorkflowPrefix + ref.Namespace() + "-" + ref.Name }

// MoveGate refuses action on a service whose move to Longhorn is unfinished, saying how to
// finish or undo the move.
func (s *Service) MoveGate(ctx context.Context, cl *kube.Clients, action string) error {
	unfinished, err := unfinishedRecords(ctx, cl)
	if err != nil {
		return err
	}
	moving, err := movingIn(ctx, cl, s.Namespace(), unfinished)
	if err != nil || !moving[s.Name] {
		return err
	}
	return fmt.Errorf("cannot %s service %s: its move to longhorn is not finished; finish it with 'kip service storage longhorn %s' or undo it with 'kip service storage longhorn %s --rollback'",
		action, s.Ref, s.Flags(), s.Flags())
}

// movingIn names the services of namespace ns whose move to Longhorn is unfinished, by what
// shows it from the move's first write on: an unfinished progress record of the move or of its
// rollback (written before the move changes anything), the fence's label on the namespace, or
// the move annotation on the Service. unfinished are the workflows with unfinished records.
func movingIn(ctx context.Context, cl *kube.Clients, ns string, unfinished map[string]bool) (map[string]bool, error) {
	moving := map[string]bool{}
	n, err := cl.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return moving, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read namespace %s: %w", ns, err)
	}
	list, err := cl.Dynamic.Resource(ServicesGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list services in %s: %w", ns, err)
	}
	for _, u := range list.Items {
		name := u.GetName()
		record := MoveWorkflowPrefix + ns + "-" + name
		if u.GetAnnotations()[MoveAnnotation] != "" || n.Labels[moveguard.NamespaceLabel(name)] != "" || unfinished[record] || unfinished[record+"-rollback"] {
			moving[name] = true
		}
	}
	return moving, nil
}

// ServiceOptions names the service a command acts on.
type ServiceOptions struct {
	Options
	Ref
	// AcceptStale (kip service start --accept-stale-data) starts a service the fence stopped on
	// copies of its data that may be older.
	AcceptStale bool
}

func (o *ServiceOptions) load(ctx context.Context) (*kube.Clients, *Service, error) {
	cl, err := o.Kube()
	if err != nil {
		return nil, nil, err
	}
	s, err := Get(ctx, cl.Dynamic, o.Ref)
	return cl, s, err
}

// Stop is kip service stop: the service's pods stop and stay stopped until kip service start.
func Stop(ctx context.Context, o *ServiceOptions) error {
	return o.switchService(ctx, true)
}

// Start is kip service start. It refuses while a move of the service's data is unfinished.
func Start(ctx context.Context, o *ServiceOptions) error {
	return o.switchService(ctx, false)
}

// switchService writes spec.stopped and waits until console-api has stopped or started the
// service.
func (o *ServiceOptions) switchService(ctx context.Context, stop bool) error {
	cl, s, err := o.load(ctx)
	if err != nil {
		return err
	}
	verb, done, already, phase, wait, timeout := "Starting", "Started", "running", PhaseRunning, WaitRunning, StartTimeout
	if stop {
		verb, done, already, phase, wait, timeout = "Stopping", "Stopped", "stopped", PhaseStopped, WaitStopped, StopTimeout
	} else if err := s.MoveGate(ctx, cl, "start"); err != nil {
		return err
	}
	if s.Stopped == stop && s.Phase == phase {
		o.Printer.StepAlready("Service " + s.Ref.String() + " already " + already)
		return nil
	}
	start := time.Now()
	if !stop && s.FenceStop != "" {
		if err := o.startFenced(ctx, cl, s); err != nil {
			return err
		}
		o.Printer.StepStarted(verb + " service " + s.Ref.String())
	} else {
		o.Printer.StepStarted(verb + " service " + s.Ref.String())
		if err := SetStopped(ctx, cl.Dynamic, s.Ref, stop); err != nil {
			return err
		}
	}
	if err := wait(ctx, cl.Dynamic, cl.Kube, s.Ref, timeout); err != nil {
		return err
	}
	o.Printer.StepDone(done+" service "+s.Ref.String(), time.Since(start))
	return nil
}

// UpdateOptions is kip service update: "" leaves a value as it is.
type UpdateOptions struct {
	ServiceOptions
	CPU, Memory, Storage string
	// Copies (kip service update --copies N) records the copies of a service whose copies are
	// unset; 0 leaves them.
	Copies int
}

// Update is kip service update: it writes the service's CPU and memory requests and its declared
// volume size; console-api rolls the service with them.
func Update(ctx context.Context, o *UpdateOptions) error {
	if o.CPU == "" && o.Memory == "" && o.Storage == "" && o.Copies == 0 {
		return cli.Usagef("nothing to update: give --cpu, --memory, --storage or --copies")
	}
	cl, s, err := o.load(ctx)
	if err != nil {
		return err
	}
	spec := map[string]any{}
	res := map[string]any{}
	var changes []string
	if o.CPU != "" {
		if err := checkRequest("--cpu", o.CPU, "405m", s.Resources.CPULimit, "CPU"); err != nil {
			return err
		}
		res["cpuRequest"] = o.CPU
		changes = append(changes, fmt.Sprintf("CPU request %s → %s", orUnset(s.Resources.CPURequest), o.CPU))
	}
	if o.Memory != "" {
		if err := checkRequest("--memory", o.Memory, "512Mi", s.Resources.MemoryLimit, "memory"); err != nil {
			return err
		}
		res["memoryRequest"] = o.Memory
		changes = append(changes, fmt.Sprintf("memory request %s → %s", orUnset(s.Resources.MemoryRequest), o.Memory))
	}
	if o.Storage != "" {
		want, err := storageSize(o.Storage)
		if err != nil {
			return err
		}
		if s.Storage != "" {
			if have, err := resource.ParseQuantity(s.Storage); err == nil && want.Cmp(have) < 0 {
				return fmt.Errorf("--storage %s is smaller than the declared %s: a volume's size only grows", o.Storage, s.Storage)
			}
		}
		spec["storage"] = o.Storage
		changes = append(changes, fmt.Sprintf("declared storage %s → %s", orUnset(s.Storage), o.Storage))
	}
	if o.Copies != 0 {
		change, err := recordCopies(ctx, cl, s, o.Copies)
		if err != nil {
			return err
		}
		spec["copies"] = int64(o.Copies)
		changes = append(changes, change)
	}
	if len(res) > 0 {
		spec["resources"] = res
	}
	if err := patchSpec(ctx, cl.Dynamic, s.Ref, spec, nil); err != nil {
		return err
	}
	o.Printer.Success(fmt.Sprintf("Updated service %s: %s", s.Ref, strings.Join(changes, ", ")))
	if s.Stopped || s.Move != "" {
		o.Printer.Info("The service is stopped; it starts with these values.")
	}
	return nil
}

// storageSize reads --storage: a positive size.
func storageSize(value string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(value)
	if err != nil || q.Sign() <= 0 {
		return q, cli.Usagef("--storage %q is not a size such as 20Gi", value)
	}
	return q, nil
}

// checkRequest refuses a request that is not a positive quantity (example shows one) or that
// exceeds the service's limit.
func checkRequest(flag, value, example, limit, what string) error {
	q, err := resource.ParseQuantity(value)
	if err != nil || q.Sign() <= 0 {
		return cli.Usagef("%s %q is not a quantity such as %s", flag, value, example)
	}
	if limit == "" {
		return nil
	}
	if l, err := resource.ParseQuantity(limit); err == nil && q.Cmp(l) > 0 {
		return fmt.Errorf("%s %s is above the service's %s limit %s: a request cannot exceed its limit", flag, value, what, limit)
	}
	return nil
}

func orUnset(v string) string {
	if v == "" {
		return "(unset)"
	}
	return v
}

// Delete is kip service delete: the Service object and the claims of its volumes go, and with
// them the data (k3s's local-path and Longhorn delete a released volume). It refuses while a
// move of the service's data is unfinished.
func Delete(ctx context.Context, o *ServiceOptions) error {
	cl, s, err := o.load(ctx)
	if err != nil {
		return err
	}
	if err := s.MoveGate(ctx, cl, "delete"); err != nil {
		return err
	}
	claims := []string{s.DataClaim()}
	if d := s.DumpClaim(); d != "" {
		claims = append(claims, d)
	}
	ok, err := o.Prompter.Confirm(fmt.Sprintf("Delete service %s and its volumes (%s) with their data?", s.Ref, strings.Join(claims, ", ")))
	if err != nil || !ok {
		return cancelled(err)
	}
	o.Printer.StepStarted("Deleting service " + s.Ref.String())
	start := time.Now()
	svcs := cl.Dynamic.Resource(ServicesGVR).Namespace(s.Namespace())
	// The UID precondition keeps a service created again meanwhile under the same name.
	err = svcs.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID},
		PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete service %s: %w", s.Ref, err)
	}
	if err := kube.PollPending(ctx, StopTimeout, "service "+s.Ref.String()+" and its pods to be gone", func(ctx context.Context) (string, error) {
		if _, err := svcs.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
			return "the Service object is still there", nil
		} else if !apierrors.IsNotFound(err) {
			return "", err
		}
		pods, err := Pods(ctx, cl.Kube, s)
		if err != nil || len(pods) == 0 {
			return "", err
		}
		return "pod " + pods[0].Name + " is still there", nil
	}); err != nil {
		return err
	}
	for _, c := range claims {
		err := cl.Kube.CoreV1().PersistentVolumeClaims(s.Namespace()).Delete(ctx, c, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete claim %s/%s: %w", s.Namespace(), c, err)
		}
	}
	o.Printer.StepDone("Deleted service "+s.Ref.String()+" and its volumes", time.Since(start))
	return nil
}

// RecreateDump is kip service recreate-dump: the service's dump volume is replaced by an empty
// one (the next scheduled dump fills it). The service stops for it and starts again if it ran.
func RecreateDump(ctx context.Context, o *ServiceOptions) error {
	cl, s, err := o.load(ctx)
	if err != nil {
		return err
	}
	dump := s.DumpClaim()
	if dump == "" {
		return fmt.Errorf("service %s (%s) has no dump volume: only %s services keep database dumps", s.Ref, s.Type, strings.Join(dumpTypes, " and "))
	}
	if err := s.MoveGate(ctx, cl, "recreate the dump volume of"); err != nil {
		return err
	}
	wasRunning := !s.Stopped
	q := fmt.Sprintf("Replace the dump volume %s of service %s with an empty one?", dump, s.Ref)
	if wasRunning {
		q = fmt.Sprintf("Stop service %s, replace its dump volume %s with an empty one and start it again?", s.Ref, dump)
	}
	ok, err := o.Prompter.Confirm(q)
	if err != nil || !ok {
		return cancelled(err)
	}
	if err := Stop(ctx, o); err != nil {
		return err
	}
	claims := cl.Kube.CoreV1().PersistentVolumeClaims(s.Namespace())
	o.Printer.StepStarted("Deleting dump volume " + dump)
	start := time.Now()
	if err := claims.Delete(ctx, dump, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete claim %s/%s: %w", s.Namespace(), dump, err)
	}
	if err := kube.PollPending(ctx, StopTimeout, "claim "+s.Namespace()+"/"+dump+" to be gone", func(ctx context.Context) (string, error) {
		_, err := claims.Get(ctx, dump, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "the claim is still there", err
	}); err != nil {
		return err
	}
	o.Printer.StepDone("Deleted dump volume "+dump, time.Since(start))
	if !wasRunning {
		o.Printer.Info("The service stays stopped; the new dump volume is created when it starts ('kip service start " + s.Flags() + "').")
		return nil
	}
	return Start(ctx, o)
}

func cancelled(err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("cancelled: nothing was changed")
}

// Info is what kip service info shows.
type Info struct {
	Service     string `json:"service"`
	Project     string `json:"project"`
	Environment string `json:"environment"`
	Namespace   string `json:"namespace"`
	Type        string `json:"type"`
	Phase       string `json:"phase"`
	Stopped     bool   `json:"stopped"`
	// Copies is how many copies of its data the service keeps, 0 when unset; CopiesNote says
	// how to record unset copies, or why its data volume waits.
	Copies       int        `json:"copies"`
	CopiesNote   string     `json:"copiesNote,omitempty"`
	Move         string     `json:"move,omitempty"`
	Resources    Resources  `json:"resources"`
	Pods         []PodInfo  `json:"pods"`
	Volumes      []VolumeAt `json:"volumes"`
	StorageClass string     `json:"storageClass,omitempty"`
	Storage      string     `json:"declaredStorage,omitempty"`
}

// PodInfo is where a pod of the service runs.
type PodInfo struct {
	Name  string `json:"name"`
	Node  string `json:"node,omitempty"`
	Phase string `json:"phase"`
	Ready bool   `json:"ready"`
}

// VolumeAt is where one of the service's volumes keeps its data.
type VolumeAt struct {
	Claim        string `json:"claim"`
	Phase        string `json:"phase"`
	Volume       string `json:"volume,omitempty"`
	StorageClass string `json:"storageClass,omitempty"`
	Size         string `json:"size,omitempty"`
	// Where is the data: a directory on a node (local-path) or a Longhorn volume.
	Where string `json:"where,omitempty"`
	// Replicas are the replicas Longhorn keeps of a Longhorn volume (its copies, in kip's
	// messages), by node, and Wanted how many it keeps (its number of replicas).
	Replicas []longhorn.Replica `json:"copies,omitempty"`
	Wanted   int                `json:"wanted,omitempty"`
}

// kept is how many copies of the volume are kept: Longhorn's number for a Longhorn volume, one
// for a local one, none for a claim not bound yet.
func (v VolumeAt) kept() int {
	switch {
	case v.Volume == "":
		return 0
	case v.Wanted > 0:
		return v.Wanted
	}
	return 1
}

// ShowInfo is kip service info.
func ShowInfo(ctx context.Context, o *ServiceOptions) error {
	cl, s, err := o.load(ctx)
	if err != nil {
		return err
	}
	info := Info{Service: s.Name, Project: s.Project, Environment: s.Environment, Namespace: s.Namespace(), Type: s.Type,
		Phase: s.Phase, Stopped: s.Stopped, Copies: s.Copies, Move: s.Move, Resources: s.Resources, StorageClass: s.StorageClass, Storage: s.Storage,
		Pods: []PodInfo{}, Volumes: []VolumeAt{}}
	pods, err := Pods(ctx, cl.Kube, s)
	if err != nil {
		return err
	}
	for _, p := range pods {
		info.Pods = append(info.Pods, PodInfo{Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase), Ready: podutils.IsPodReady(&p)})
	}
	claims := []string{s.DataClaim()}
	if d := s.DumpClaim(); d != "" {
		claims = append(claims, d)
	}
	for _, c := range claims {
		v, err := volumeAt(ctx, cl, s.Namespace(), c)
		if err != nil {
			return err
		}
		info.Volumes = append(info.Volumes, v)
	}
	if err := o.copiesInfo(ctx, cl, s, &info); err != nil {
		return err
	}
	if o.JSON {
		return cli.WriteJSON(o.Out, info)
	}
	return writeInfo(o.Out, info)
}

func volumeAt(ctx context.Context, cl *kube.Clients, namespace, claim string) (VolumeAt, error) {
	v := VolumeAt{Claim: claim}
	pvc, err := cl.Kube.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		v.Phase = "missing"
		return v, nil
	}
	if err != nil {
		return v, fmt.Errorf("read claim %s/%s: %w", namespace, claim, err)
	}
	v.Phase, v.Volume = string(pvc.Status.Phase), pvc.Spec.VolumeName
	if pvc.Spec.StorageClassName != nil {
		v.StorageClass = *pvc.Spec.StorageClassName
	}
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		v.Size = q.String()
	}
	if pvc.Spec.VolumeName == "" {
		return v, nil
	}
	pv, err := cl.Kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		v.Where = "volume " + pvc.Spec.VolumeName + " is missing"
		return v, nil
	}
	if err != nil {
		return v, fmt.Errorf("read volume %s: %w", pvc.Spec.VolumeName, err)
	}
	v.Where = Where(pv)
	if vol := longhorn.VolumeName(pv); vol != "" {
		vc, err := longhorn.ReadVolumeReplicas(ctx, cl, claim, vol)
		if err != nil {
			return v, err
		}
		v.Replicas, v.Wanted = vc.Replicas, vc.Wanted
	}
	return v, nil
}

// Where says where a volume keeps its data: the directory and node of a local volume, or the
// Longhorn volume.
func Where(pv *corev1.PersistentVolume) string {
	path, node := LocalPath(pv)
	switch {
	case longhorn.VolumeName(pv) != "":
		return "Longhorn volume " + longhorn.VolumeName(pv)
	case path != "" && node != "":
		return path + " on node " + node
	case path != "":
		return path
	case pv.Spec.CSI != nil:
		return pv.Spec.CSI.Driver + " volume " + pv.Spec.CSI.VolumeHandle
	}
	return "volume " + pv.Name
}

// NodeOf is the one node a local volume is pinned to by its node affinity, "" when none.
func NodeOf(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == corev1.LabelHostname && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

func writeInfo(w io.Writer, i Info) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Service:      %s (%s)\n", i.Service, i.Type)
	fmt.Fprintf(&b, "Project:      %s, environment %s (namespace %s)\n", i.Project, i.Environment, i.Namespace)
	state := orUnknown(i.Phase)
	if i.Stopped {
		state += " (stopped)"
	}
	fmt.Fprintf(&b, "State:        %s\n", state)
	if i.Move != "" {
		fmt.Fprintf(&b, "Move:         to %s, not finished\n", i.Move)
	}
	fmt.Fprintf(&b, "Resources:    CPU %s (limit %s), memory %s (limit %s)\n", orUnset(i.Resources.CPURequest), orUnset(i.Resources.CPULimit),
		orUnset(i.Resources.MemoryRequest), orUnset(i.Resources.MemoryLimit))
	fmt.Fprintf(&b, "Storage:      declared %s, class %s\n", orUnset(i.Storage), orDefault(i.StorageClass))
	switch {
	case i.Copies == 0:
		fmt.Fprintf(&b, "Copies:       %s\n", i.CopiesNote)
	case i.CopiesNote != "":
		fmt.Fprintf(&b, "Copies:       %d: %s\n", i.Copies, i.CopiesNote)
	default:
		fmt.Fprintf(&b, "Copies:       %d\n", i.Copies)
	}
	if len(i.Pods) == 0 {
		b.WriteString("Runs on:      no pod\n")
	}
	for _, p := range i.Pods {
		ready := "not ready"
		if p.Ready {
			ready = "ready"
		}
		fmt.Fprintf(&b, "Runs on:      node %s (pod %s, %s, %s)\n", orUnset(p.Node), p.Name, p.Phase, ready)
	}
	for _, v := range i.Volumes {
		where := v.Where
		if where == "" {
			where = "not bound yet"
		}
		fmt.Fprintf(&b, "Data:         %s (%s", v.Claim, v.Phase)
		if v.StorageClass != "" {
			fmt.Fprintf(&b, ", class %s", v.StorageClass)
		}
		if v.Size != "" {
			fmt.Fprintf(&b, ", %s", v.Size)
		}
		fmt.Fprintf(&b, "): %s", where)
		if len(v.Replicas) > 0 {
			var on []string
			for _, r := range v.Replicas {
				state := "current"
				if !r.Current {
					state = "may be older"
				}
				on = append(on, r.Node+" ("+state+")")
			}
			fmt.Fprintf(&b, ", copies on %s", strings.Join(on, ", "))
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orDefault(class string) string {
	if class == "" {
		return "the cluster's default"
	}
	return class
}

// ProjectOptions names a project (and, for remove-env, an environment).
type ProjectOptions struct {
	Options
	Project, Environment string
}

// unfinishedRecords names the workflows whose progress records are unfinished.
func unfinishedRecords(ctx context.Context, cl *kube.Clients) (map[string]bool, error) {
	records, err := workflow.ListUnfinished(ctx, cl.Dynamic, kube.ClusterRecords())
	if err != nil {
		return nil, err
	}
	unfinished := map[string]bool{}
	for _, p := range records {
		unfinished[p.Workflow] = true
	}
	return unfinished, nil
}

// movesIn lists the unfinished moves in namespaces (movingIn), reading the records once.
func movesIn(ctx context.Context, cl *kube.Clients, project string, namespaces []string) ([]string, error) {
	unfinished, err := unfinishedRecords(ctx, cl)
	if err != nil {
		return nil, err
	}
	var moves []string
	for _, ns := range namespaces {
		moving, err := movingIn(ctx, cl, ns, unfinished)
		if err != nil {
			return nil, err
		}
		for name := range moving {
			ref := Ref{Project: project, Environment: strings.TrimPrefix(ns, project+"-"), Name: name}
			moves = append(moves, fmt.Sprintf("%s ('kip service storage longhorn %s' finishes it, --rollback undoes it)", ref, ref.Flags()))
		}
	}
	slices.Sort(moves)
	return moves, nil
}

// DeleteProject is kip project delete: console-api deletes the project's namespaces with everything
// in them. It refuses while a move of a service's data is unfinished in any of them.
func DeleteProject(ctx context.Context, o *ProjectOptions) error {
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	p, err := Project(ctx, cl.Dynamic, o.Project)
	if err != nil {
		return err
	}
	var namespaces []string
	for _, env := range Environments(p) {
		namespaces = append(namespaces, o.Project+"-"+env)
	}
	moves, err := movesIn(ctx, cl, o.Project, namespaces)
	if err != nil {
		return err
	}
	if len(moves) > 0 {
		return fmt.Errorf("cannot delete project %s while a move to Longhorn is not finished in it: %s", o.Project, strings.Join(moves, "; "))
	}
	ok, err := o.Prompter.Confirm(fmt.Sprintf("Delete project %s and its namespaces (%s), with every app, service and volume in them?", o.Project, cli.OrNone(strings.Join(namespaces, ", "))))
	if err != nil || !ok {
		return cancelled(err)
	}
	uid := p.GetUID()
	err = cl.Dynamic.Resource(ProjectsGVR).Delete(ctx, o.Project, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete project %s: %w", o.Project, err)
	}
	o.Printer.Success(fmt.Sprintf("Deleted project %s; console-api removes its namespaces (kubectl get namespaces %s shows them going)", o.Project, strings.Join(namespaces, " ")))
	return nil
}

// RemoveEnv is kip project remove-env: the environment leaves the project and console-api deletes
// its namespace. It refuses while a move of a service's data is unfinished there.
func RemoveEnv(ctx context.Context, o *ProjectOptions) error {
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	p, err := Project(ctx, cl.Dynamic, o.Project)
	if err != nil {
		return err
	}
	envs := Environments(p)
	if !slices.Contains(envs, o.Environment) {
		return fmt.Errorf("project %s has no environment %q (environments: %s)", o.Project, o.Environment, cli.OrNone(strings.Join(envs, ", ")))
	}
	ns := o.Project + "-" + o.Environment
	moves, err := movesIn(ctx, cl, o.Project, []string{ns})
	if err != nil {
		return err
	}
	if len(moves) > 0 {
		return fmt.Errorf("cannot remove environment %s of project %s while a move to Longhorn is not finished there: %s", o.Environment, o.Project, strings.Join(moves, "; "))
	}
	ok, err := o.Prompter.Confirm(fmt.Sprintf("Remove environment %s from project %s and delete namespace %s with every app, service and volume in it?", o.Environment, o.Project, ns))
	if err != nil || !ok {
		return cancelled(err)
	}
	raw, _, _ := unstructured.NestedSlice(p.Object, "spec", "environments")
	for i, e := range raw {
		if m, ok := e.(map[string]any); ok && m["name"] == o.Environment {
			// The test operation refuses the change if the list moved since it was read.
			patch := fmt.Sprintf(`[{"op":"test","path":"/spec/environments/%d/name","value":%q},{"op":"remove","path":"/spec/environments/%d"}]`, i, o.Environment, i)
			if _, err := cl.Dynamic.Resource(ProjectsGVR).Patch(ctx, o.Project, types.JSONPatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager}); err != nil {
				return fmt.Errorf("remove environment %s from project %s: %w", o.Environment, o.Project, err)
			}
			break
		}
	}
	o.Printer.Success(fmt.Sprintf("Removed environment %s from project %s; console-api deletes namespace %s", o.Environment, o.Project, ns))
	return nil
}
