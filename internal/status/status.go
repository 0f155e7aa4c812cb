// Package status is kip status, a report of the cluster's nodes, storage, components and
// unfinished operations, and kip doctor, a list of checks each with its fix. Both read the
// cluster through the API with a bounded number of requests (no request per namespace), and read
// the hosts over SSH when they can; without SSH they report what the API gives and say what they
// skipped. docs/status.md describes both and their JSON.
package status

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/clock"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/prune"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/manifests"
)

// DialFunc connects to a host over SSH with the cluster's settings.
type DialFunc func(ctx context.Context, host string) (*sshx.Client, error)

// Options configure Status and Doctor. cmd/kip binds APIOnly to --api-only and wires the rest.
type Options struct {
	// APIOnly skips every host check: nothing connects over SSH.
	APIOnly bool
	// JSON writes the report as JSON (-o json) rather than text.
	JSON bool
	// Out receives the report.
	Out io.Writer
	// Kube returns the cluster's API clients.
	Kube func() (*kube.Clients, error)
	// Server is the server's SSH address as saved for the cluster; "" falls back to the address
	// the cluster record names.
	Server string
	// Dial connects to a host over SSH; nil skips the host checks.
	Dial DialFunc
	// KipVersion is this kip's version.
	KipVersion string
	// Clock is the time the kept copies are judged at, clock.Now when nil.
	Clock func() time.Time
}

// sshFix says how to let kip reach the hosts.
const sshFix = "pass --ssh-key with the key that logs in to the server and every worker (or set KIP_SSH_KEY), " +
	"or --cluster with a cluster saved by kip install, whose key and user kip uses"

// hostKeyFix says what to do about a host whose SSH host key is not the one kip trusts; forget
// is the command that removes the old key from kip's known_hosts (sshx.HostKeyChanged).
func hostKeyFix(forget string) string {
	return "find out why before connecting: someone may be intercepting the connection, or the server was reinstalled. " +
		"On the server's own console (not over this network), print its host key fingerprints: cat /etc/ssh/ssh_host_*_key.pub | ssh-keygen -lf - ; " +
		"only if one is the fingerprint the server offered, remove the old key from kip's known_hosts with: " + forget +
		" ; kip then trusts the new key when it next connects, and says so"
}

// LonghornLowBytes: status warns when a node's roomiest eligible Longhorn disk has less than this
// available for scheduling.
const LonghornLowBytes = 5 << 30

// MaxVolumes is how many of a node's largest volumes Status lists.
const MaxVolumes = 5

// Report is the documented shape of 'kip status -o json' (docs/status.md).
type Report struct {
	Cluster    ClusterInfo       `json:"cluster"`
	Nodes      []Node            `json:"nodes"`
	Components []ComponentHealth `json:"components"`
	// Operations are the kip operations recorded as unfinished, oldest first; moves to
	// Longhorn have kind "move-to-longhorn".
	Operations []Operation `json:"operations"`
	// KeptCopies are the local copies moves to Longhorn kept, each with what holds it back
	// (docs/prune.md); KeptCopiesBytes is the space those whose size is known use.
	KeptCopies      []prune.Kept `json:"keptCopies"`
	KeptCopiesBytes int64        `json:"keptCopiesBytes"`
	// Stranded are the services whose data volume is missing, and those stranded on a worker
	// that stopped reporting or is fenced.
	Stranded []Stranded `json:"strandedServices"`
	// CopiesUnset are, on a Longhorn cluster, the services whose copies are unset: Kipper leaves
	// their storage as it is.
	CopiesUnset []CopiesUnset `json:"copiesUnset"`
	// WorkerReplicas are the Longhorn volumes with no current replica on the server, only on
	// workers; each is also a warning.
	WorkerReplicas []longhorn.WorkerReplica `json:"workerCopies"`
	// NotPinned are the Longhorn volumes of one copy that are not pinned to the server: a
	// rebuild can place their copy on a worker.
	NotPinned []longhorn.Unpinned `json:"notPinned"`
	// HostChecks are kip doctor's host checks, run over SSH on the server and every recorded
	// worker; each that is not right is also a warning.
	HostChecks []Check `json:"hostChecks"`
	// Warnings are what needs attention, each in one sentence.
	Warnings []string `json:"warnings"`
	// Skipped says what status could not look at, and why.
	Skipped []string `json:"skipped"`
}

// Stranded is a service whose data claim is lost or names a volume that does not exist, or one
// with a single-node volume on a worker that stopped reporting or is fenced (Node).
type Stranded struct {
	Service service.Ref `json:"service"`
	Claim   string      `json:"claim"`
	Reason  string      `json:"reason"`
	// Node is the worker it is stranded on, CurrentOn the nodes that hold a current copy of all
	// its data.
	Node      string   `json:"node,omitempty"`
	CurrentOn []string `json:"currentOn,omitempty"`
}

// CopiesUnset is a service created before copies were recorded: Kept is how many copies
// Longhorn keeps of its data volume, Record the command that records them.
type CopiesUnset struct {
	Service service.Ref `json:"service"`
	Kept    int         `json:"kept"`
	Record  string      `json:"record"`
}

// ClusterInfo is what the cluster record says (kipper.run/cluster, docs/records.md).
type ClusterInfo struct {
	// Recorded is false on a cluster kip did not install: the other fields are then empty.
	Recorded   bool                `json:"recorded"`
	Storage    string              `json:"storage,omitempty"`
	Profile    string              `json:"profile,omitempty"`
	Network    string              `json:"network,omitempty"`
	Monitoring *cluster.Monitoring `json:"monitoring,omitempty"`
	Backups    string              `json:"backups,omitempty"`
	Server     string              `json:"server,omitempty"`
	// KipVersion is the kip that installed the cluster or last re-ran install.
	KipVersion string `json:"kipVersion,omitempty"`
}

// Node is one Kubernetes node, with its storage.
type Node struct {
	cluster.NodeInfo
	// Storage is the node's disks and largest volumes; nil when nothing is known.
	Storage *NodeStorage `json:"storage,omitempty"`
}

// NodeStorage is a node's free disk and its largest volumes.
type NodeStorage struct {
	// Disks are the Longhorn disks of the node, or the file system holding the local volumes.
	Disks []Disk `json:"disks"`
	// Volumes are the largest volumes on the node, largest first, at most MaxVolumes.
	Volumes []Volume `json:"volumes"`
	// VolumeCount is how many volumes the node holds in all.
	VolumeCount int `json:"volumeCount"`
	// Low says the disk runs low; Warning says how.
	Low     bool   `json:"low"`
	Warning string `json:"warning,omitempty"`
}

// Disk is a Longhorn disk, or the file system holding local volumes.
type Disk struct {
	// Name is the Longhorn disk's name; "" for the local file system.
	Name       string `json:"name,omitempty"`
	Path       string `json:"path"`
	TotalBytes int64  `json:"totalBytes"`
	FreeBytes  int64  `json:"freeBytes"`
	// SchedulableBytes is what Longhorn can still schedule onto the disk (Longhorn only).
	SchedulableBytes *int64 `json:"schedulableBytes,omitempty"`
	// Eligible says Longhorn may schedule onto the disk: the node and the disk allow scheduling,
	// neither is being evicted, and the disk is Ready (Longhorn only).
	Eligible *bool `json:"eligible,omitempty"`
}

// Volume is a volume on a node.
type Volume struct {
	// Name is the PersistentVolume's name, or the Longhorn volume's when it has none.
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Claim     string `json:"claim,omitempty"`
	// Storage is local or longhorn.
	Storage string `json:"storage"`
	// UsedBytes is the space the volume uses on the disk; nil when unknown (a local volume
	// without SSH).
	UsedBytes *int64 `json:"usedBytes,omitempty"`
	// SizeBytes is the declared size; 0 when none is known.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Orphaned is a local volume directory that no PersistentVolume uses: a copy kept after a
	// move to Longhorn, or a leftover.
	Orphaned bool `json:"orphaned,omitempty"`
}

// ComponentHealth is one installed component's state.
type ComponentHealth struct {
	Name  string `json:"name"`
	Ready bool   `json:"ready"`
	// Pending says what the component waits for.
	Pending string `json:"pending,omitempty"`
	// Error says why its state could not be read.
	Error string `json:"error,omitempty"`
}

// Operation kinds.
const (
	KindOperation      = "operation"
	KindMoveToLonghorn = "move-to-longhorn"
)

// Operation is an unfinished kip operation, from its progress record.
type Operation struct {
	Workflow  string    `json:"workflow"`
	Kind      string    `json:"kind"`
	Status    string    `json:"status"`
	Step      string    `json:"step,omitempty"`
	Error     string    `json:"error,omitempty"`
	StartedBy string    `json:"startedBy"`
	StartedAt time.Time `json:"startedAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// Resume is the command that continues it: the same command run again.
	Resume string `json:"resume,omitempty"`
}

// Run reports the cluster's status to o.Out.
func Run(ctx context.Context, o *Options) error {
	r, err := Collect(ctx, o)
	var down *APIDownError
	if errors.As(err, &down) && !o.JSON {
		if werr := down.WriteText(o.Out); werr != nil {
			return werr
		}
	}
	if err != nil {
		return err
	}
	if o.JSON {
		return cli.WriteJSON(o.Out, r)
	}
	return r.WriteText(o.Out)
}

// view is what the API showed, read once for Status and Doctor.
type view struct {
	c        *kube.Clients
	rec      cluster.Record
	recorded bool
	nodes    []corev1.Node
	// workers is what kip recorded of the workers it joined (read with the record).
	workers cluster.Nodes
	// pvs are the cluster's PersistentVolumes, listed once for storage and the kept copies.
	pvs []corev1.PersistentVolume
	// used is the space each local volume's directory uses, by PersistentVolume, where the host
	// checks measured it.
	used map[string]*int64
	// lhVolumes and lhReplicas are Longhorn's volumes and replicas, listed once on a Longhorn
	// cluster.
	lhVolumes  []longhornv1beta2.Volume
	lhReplicas []longhornv1beta2.Replica
	// svcs are Kipper's services, listed once when a part of the report needs them (services).
	svcs     []*service.Service
	svcsRead bool
}

// services lists Kipper's services once.
func (v *view) services(ctx context.Context) ([]*service.Service, error) {
	if v.svcsRead {
		return v.svcs, nil
	}
	svcs, err := service.List(ctx, v.c.Dynamic, v.c.Kube)
	if err != nil {
		return nil, err
	}
	v.svcs, v.svcsRead = svcs, true
	return svcs, nil
}

// readRecord reads the cluster record and the workers' into v, from one read of the records;
// an error is reported, not fatal.
func (v *view) readRecord(ctx context.Context) error {
	ann, err := kube.ReadAnnotations(ctx, v.c.Dynamic, kube.ClusterRecords())
	if err != nil {
		return err
	}
	if v.rec, v.recorded, err = cluster.RecordIn(ann); err != nil {
		return err
	}
	v.workers, err = cluster.NodesIn(ann)
	return err
}

func (v *view) readNodes(ctx context.Context) error {
	list, err := v.c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	v.nodes = list.Items
	slices.SortFunc(v.nodes, func(a, b corev1.Node) int {
		return cmp.Or(cmp.Compare(cluster.RoleOrder(cluster.NodeRole(&a)), cluster.RoleOrder(cluster.NodeRole(&b))), cmp.Compare(a.Name, b.Name))
	})
	return nil
}

// Collect gathers the report: the API first, then, on a local-storage cluster, the server's
// disk and volumes over SSH.
func Collect(ctx context.Context, o *Options) (*Report, error) {
	c, err := o.Kube()
	if err != nil {
		return nil, err
	}
	v := &view{c: c}
	r := &Report{Nodes: []Node{}, Components: []ComponentHealth{}, Operations: []Operation{}, KeptCopies: []prune.Kept{},
		Stranded: []Stranded{}, CopiesUnset: []CopiesUnset{}, WorkerReplicas: []longhorn.WorkerReplica{}, NotPinned: []longhorn.Unpinned{}, HostChecks: []Check{}, Warnings: []string{}, Skipped: []string{}}
	if err := v.readNodes(ctx); err != nil {
		if apiDown(err) {
			return nil, apiDownError(ctx, o, c, err)
		}
		return nil, fmt.Errorf("read cluster status: %w", err)
	}
	if err := v.readRecord(ctx); err != nil {
		r.Warnings = append(r.Warnings, err.Error())
	}
	r.Cluster = clusterInfo(v)
	now := clock.Now
	if o.Clock != nil {
		now = o.Clock
	}
	for i := range v.nodes {
		n := Node{NodeInfo: cluster.Info(&v.nodes[i])}
		r.Nodes = append(r.Nodes, n)
		if n.Status != cluster.NodeReady {
			r.Warnings = append(r.Warnings, fmt.Sprintf("node %s is %s", n.Name, n.Status))
		}
	}
	server := readHosts(ctx, o, v, r, now())
	if err := collectStorage(ctx, v, server, r); err != nil {
		return nil, err
	}
	r.Components = componentHealth(ctx, v, r)
	ops, err := workflow.ListUnfinished(ctx, c.Dynamic, kube.ClusterRecords())
	if err != nil {
		r.Warnings = append(r.Warnings, err.Error())
	}
	for _, p := range ops {
		r.Operations = append(r.Operations, operation(p))
	}
	if v.recorded {
		if err := keptCopies(ctx, v, r, now()); err != nil {
			r.Warnings = append(r.Warnings, err.Error())
		}
		if err := stranded(ctx, v, r); err != nil {
			r.Warnings = append(r.Warnings, err.Error())
		}
		if err := strandedOnWorkers(ctx, v, r); err != nil {
			r.Warnings = append(r.Warnings, err.Error())
		}
		if err := copiesUnset(ctx, v, r); err != nil {
			r.Warnings = append(r.Warnings, err.Error())
		}
	}
	return r, nil
}

// copiesUnset lists, on a Longhorn cluster, the services whose copies are unset (created before
// copies were recorded) with the copies Longhorn keeps of their data volume (one for a volume
// still on local storage) and the command that records them.
func copiesUnset(ctx context.Context, v *view, r *Report) error {
	if v.rec.Storage != cluster.StorageLonghorn {
		return nil
	}
	svcs, err := v.services(ctx)
	if err != nil {
		return err
	}
	for _, s := range svcs {
		if s.Copies != 0 {
			continue
		}
		kept := 1
		if vols := longhorn.ReplicasIn(v.lhVolumes, v.lhReplicas, s.Namespace(), []string{s.DataClaim()}); len(vols) > 0 {
			kept = vols[0].Wanted
		}
		r.CopiesUnset = append(r.CopiesUnset, CopiesUnset{Service: s.Ref, Kept: kept,
			Record: fmt.Sprintf("kip service update %s --copies %d", s.Flags(), kept)})
	}
	return nil
}

// strandedOnWorkers lists the services stranded on each worker that is not Ready: those with a
// Longhorn volume attached there, with the nodes that hold a current copy of all their data, and
// those its fence stopped. It reads the API (Kipper's services) only when there is one.
func strandedOnWorkers(ctx context.Context, v *view, r *Report) error {
	claims := map[string]map[string]bool{} // by worker: the namespace/claim of the volumes attached there
	for i := range v.nodes {
		n := &v.nodes[i]
		if cluster.NodeRole(n) != cluster.RoleWorker || cluster.NodeStatus(n) == cluster.NodeReady {
			continue
		}
		claims[n.Name] = map[string]bool{}
		for _, vol := range v.lhVolumes {
			if ks := vol.Status.KubernetesStatus; vol.Status.CurrentNodeID == n.Name && ks.PVCName != "" {
				claims[n.Name][ks.Namespace+"/"+ks.PVCName] = true
			}
		}
		if w := v.workers.Workers[n.Name]; len(claims[n.Name]) == 0 && (w.Fence == nil || len(w.Fence.Stopped) == 0) {
			delete(claims, n.Name)
		}
	}
	if len(claims) == 0 {
		return nil
	}
	svcs, err := v.services(ctx)
	if err != nil {
		return err
	}
	for i := range v.nodes {
		n := &v.nodes[i]
		if claims[n.Name] == nil {
			continue
		}
		for _, s := range service.OnNode(svcs, claims[n.Name], n.Name) {
			copies := longhorn.ReplicasIn(v.lhVolumes, v.lhReplicas, s.Namespace(), s.Claims())
			var cutOff []string
			if f := v.workers.Workers[n.Name].Fence; f != nil {
				cutOff = f.CutOff
			}
			data := service.JudgeFenced(copies, n.Name, cutOff)
			why := strandedWhy(n.Name, v.workers.Workers[n.Name].Host, cluster.NodeStatus(n), s, data, longhorn.CurrentOn(copies, n.Name))
			r.Stranded = append(r.Stranded, Stranded{Service: s.Ref, Claim: s.DataClaim(), Reason: why, Node: n.Name, CurrentOn: longhorn.CurrentOn(copies, n.Name)})
			r.Warnings = append(r.Warnings, fmt.Sprintf("service %s is stranded: %s", s.Ref, why))
		}
	}
	return nil
}

// strandedWhy says why service s is stranded on worker, whose host is host ("" when not recorded),
// in state st, how its data stands there (longhorn.Judge) and on which nodes it is current, and
// what brings it back.
func strandedWhy(worker, host, st string, s *service.Service, data string, currentOn []string) string {
	copies := service.DataWhy(data, worker, currentOn)
	switch {
	case s.FenceStop == worker:
		return fmt.Sprintf("the fence of %s stopped it (%s): rejoin %s with %s, or see kip service start %s", worker, copies, worker, service.RejoinCommand(host), s.Flags())
	case st == cluster.NodeOutOfService:
		return fmt.Sprintf("%s is fenced (%s)", worker, copies)
	}
	return fmt.Sprintf("it has a volume on %s, which is %s (%s): once you know %s is down, run kip node fence %s", worker, st, copies, worker, worker)
}

// keptCopies lists the local copies moves kept, with the space each uses where the host checks
// measured it.
func keptCopies(ctx context.Context, v *view, r *Report, now time.Time) error {
	copies, err := prune.FromVolumes(ctx, v.c, v.rec, now, v.pvs)
	if err != nil {
		return fmt.Errorf("the local copies kept after moves: %w", err)
	}
	for i := range copies {
		c := &copies[i]
		c.UsedBytes = v.used[c.Volume]
		if c.UsedBytes != nil {
			r.KeptCopiesBytes += *c.UsedBytes
		}
	}
	r.KeptCopies = copies
	return nil
}

// stranded lists the services whose data claim is lost or bound to a volume that is gone: one
// list of the claims, and the services only when a claim is stranded.
func stranded(ctx context.Context, v *view, r *Report) error {
	claims, err := v.c.Kube.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list persistent volume claims: %w", err)
	}
	lost := lostClaims(claims.Items, v.pvs)
	if len(lost) == 0 {
		return nil
	}
	svcs, err := v.services(ctx)
	if err != nil {
		return err
	}
	for _, svc := range svcs {
		why, ok := lost[svc.Namespace()+"/"+svc.DataClaim()]
		if !ok {
			continue
		}
		r.Stranded = append(r.Stranded, Stranded{Service: svc.Ref, Claim: svc.DataClaim(), Reason: why})
		r.Warnings = append(r.Warnings, fmt.Sprintf("service %s is stranded: %s", svc.Ref, why))
	}
	return nil
}

// lostClaims are the claims that are Lost or bound to a volume not among pvs, by
// namespace/name, with why.
func lostClaims(claims []corev1.PersistentVolumeClaim, pvs []corev1.PersistentVolume) map[string]string {
	exists := map[string]bool{}
	for _, pv := range pvs {
		exists[pv.Name] = true
	}
	lost := map[string]string{}
	for _, c := range claims {
		switch {
		case c.Status.Phase == corev1.ClaimLost:
			lost[c.Namespace+"/"+c.Name] = fmt.Sprintf("its claim %s is Lost: volume %s is gone", c.Name, cli.OrDash(c.Spec.VolumeName))
		case c.Spec.VolumeName != "" && c.Status.Phase == corev1.ClaimBound && !exists[c.Spec.VolumeName]:
			lost[c.Namespace+"/"+c.Name] = fmt.Sprintf("its claim %s names volume %s, which does not exist", c.Name, c.Spec.VolumeName)
		}
	}
	return lost
}

func clusterInfo(v *view) ClusterInfo {
	if !v.recorded {
		return ClusterInfo{}
	}
	m := v.rec.Monitoring
	return ClusterInfo{
		Recorded: true, Storage: v.rec.Storage, Profile: v.rec.Profile, Network: v.rec.Network,
		Monitoring: &m, Backups: v.rec.Backups, Server: v.rec.Server, KipVersion: v.rec.KipVersion,
	}
}

// nodeStatus is Ready, NotReady, Unknown or OutOfService.
func operation(p workflow.Progress) Operation {
	op := Operation{
		Workflow: p.Workflow, Kind: KindOperation, Status: string(p.Status), Step: p.Step, Error: p.Error,
		StartedBy: p.StartedBy, StartedAt: p.StartedAt, UpdatedAt: p.UpdatedAt,
	}
	if strings.HasPrefix(p.Workflow, service.MoveWorkflowPrefix) {
		op.Kind = KindMoveToLonghorn
	}
	// StartedBy is the holder text: "kip node add 203.0.113.11 by alice@laptop, pid 4242".
	if i := strings.LastIndex(p.StartedBy, " by "); i > 0 && strings.HasPrefix(p.StartedBy, "kip ") {
		op.Resume = p.StartedBy[:i]
	}
	return op
}

// servers returns the server nodes.
func (v *view) servers() []*corev1.Node {
	var s []*corev1.Node
	for i := range v.nodes {
		if cluster.NodeRole(&v.nodes[i]) == cluster.RoleServer {
			s = append(s, &v.nodes[i])
		}
	}
	return s
}

// serverAddr is where to reach the server over SSH: the saved cluster's host, else the
// record's.
func (v *view) serverAddr(o *Options) string {
	if o.Server != "" {
		return o.Server
	}
	return v.rec.Server
}

// collectStorage fills each node's storage: Longhorn's disks and volumes from the API; local
// volumes from the PersistentVolumes and, from what readHosts read on the server (server, nil
// when it did not), the server's disk and the space each volume's directory uses.
func collectStorage(ctx context.Context, v *view, server *inspection, r *Report) error {
	pvs, err := v.c.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list persistent volumes: %w", err)
	}
	byNode := map[string]*NodeStorage{}
	storage := func(node string) *NodeStorage {
		s := byNode[node]
		if s == nil {
			s = &NodeStorage{Disks: []Disk{}, Volumes: []Volume{}}
			byNode[node] = s
		}
		return s
	}
	// Local volumes, by their node affinity.
	localByPath := map[string]*corev1.PersistentVolume{}
	v.pvs = pvs.Items
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		path, node := service.LocalPath(pv)
		if path == "" {
			continue
		}
		localByPath[path] = pv
		if node != "" {
			s := storage(node)
			s.Volumes = append(s.Volumes, pvVolume(pv, nil))
		}
	}
	if v.rec.Storage == cluster.StorageLonghorn {
		if err := longhornStorage(ctx, v, storage, r); err != nil {
			r.Warnings = append(r.Warnings, err.Error())
		}
	}
	if v.recorded && server != nil {
		// On Longhorn too: the platform's own volumes and the copies moves kept stay local.
		localStorage(server, v, storage, localByPath, r)
	}
	for i := range r.Nodes {
		s := byNode[r.Nodes[i].Name]
		if s == nil {
			continue
		}
		slices.SortStableFunc(s.Volumes, func(a, b Volume) int { return cmp.Compare(volumeBytes(b), volumeBytes(a)) })
		s.VolumeCount = len(s.Volumes)
		s.Volumes = s.Volumes[:min(len(s.Volumes), MaxVolumes)]
		if s.Low {
			r.Warnings = append(r.Warnings, fmt.Sprintf("node %s: %s", r.Nodes[i].Name, s.Warning))
		}
		r.Nodes[i].Storage = s
	}
	return nil
}

// volumeBytes orders volumes: by the space used where known, else by the declared size.
func volumeBytes(v Volume) int64 {
	if v.UsedBytes != nil {
		return *v.UsedBytes
	}
	return v.SizeBytes
}

func pvVolume(pv *corev1.PersistentVolume, used *int64) Volume {
	vol := Volume{Name: pv.Name, Storage: cluster.StorageLocal, UsedBytes: used}
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		vol.SizeBytes = q.Value()
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		vol.Namespace, vol.Claim = ref.Namespace, ref.Name
	}
	return vol
}

// What status reads over SSH, named where it says what it skipped.
const (
	hostChecksWhat = "host checks"
	localWhat      = "the server's free disk and the space its local volumes use"
)

// readHosts runs the host checks (doctor's) on the server and every recorded worker over one
// SSH connection each, and on the server also reads the space its local volumes use. Every
// check that is not right becomes a warning, and a host kip cannot reach is named. It returns
// the server's inspection, nil when it was not read.
func readHosts(ctx context.Context, o *Options, v *view, r *Report, now time.Time) *inspection {
	switch {
	case o.APIOnly:
		r.Skipped = append(r.Skipped, hostChecksWhat+" and "+localWhat+": --api-only")
		return nil
	case o.Dial == nil:
		r.Skipped = append(r.Skipped, hostChecksWhat+" and "+localWhat+": SSH is not set up; "+sshFix)
		return nil
	}
	var targets []target
	servers := v.servers()
	switch addr := v.serverAddr(o); {
	case addr == "":
		r.Skipped = append(r.Skipped, "the server's "+hostChecksWhat+" and "+localWhat+": no SSH address for the server is known (no saved cluster, and the cluster record names none); "+sshFix)
	case len(servers) != 1:
		r.Skipped = append(r.Skipped, fmt.Sprintf("the server's %s and %s: the cluster has %d server nodes", hostChecksWhat, localWhat, len(servers)))
	default:
		targets = append(targets, target{node: servers[0].Name, addr: addr, server: true})
	}
	for _, name := range slices.Sorted(maps.Keys(v.workers.Workers)) {
		targets = append(targets, target{node: name, addr: v.workers.Workers[name].Host})
	}
	diskPaths := []string{cluster.RancherDir}
	if v.rec.Storage == cluster.StorageLocal {
		diskPaths = append(diskPaths, k3sPaths.storage)
	}
	results := inspectHosts(ctx, o.Dial, targets, hostRequest{
		facts: []string{cluster.RancherDir, k3sPaths.storage},
		probe: func(t target) []string {
			args := k3sPaths.doctorArgs(t)
			if t.server && v.recorded {
				args = append(args, "volumes="+k3sPaths.storage)
			}
			return args
		},
		firewall: true,
	})
	var server *inspection
	for i, in := range results {
		if in.target.server {
			server = &results[i]
		}
		for _, c := range evaluateHost(in, v.rec, k3sPaths, diskPaths, now, false) {
			r.HostChecks = append(r.HostChecks, c)
			if c.Status == StatusWarn || c.Status == StatusFail {
				r.Warnings = append(r.Warnings, c.sentence())
			}
		}
	}
	return server
}

// localStorage fills in the server's local volumes from what readHosts read there: the free
// space of the file system holding them, and the space each directory uses.
func localStorage(in *inspection, v *view, storage func(string) *NodeStorage, byPath map[string]*corev1.PersistentVolume, r *Report) {
	node, dir := in.target.node, k3sPaths.storage
	if in.dialErr != nil {
		r.Skipped = append(r.Skipped, localWhat+": kip did not reach the server over SSH (see Warnings)")
		return
	}
	s := storage(node)
	if in.factsErr != nil {
		r.Skipped = append(r.Skipped, fmt.Sprintf("free disk on %s: %v", node, in.factsErr))
	} else if d, ok := in.facts.Disks[dir]; ok {
		s.Disks = append(s.Disks, Disk{Path: d.Mount, TotalBytes: int64(d.TotalBytes), FreeBytes: int64(d.FreeBytes)})
		if level := diskLevel(d.TotalBytes, d.FreeBytes); level != StatusOK {
			s.Low = true
			s.Warning = fmt.Sprintf("disk runs low: %s free of %s on %s, which holds the local volumes; below %d%% free the kubelet evicts pods",
				cli.FormatBytes(int64(d.FreeBytes)), cli.FormatBytes(int64(d.TotalBytes)), d.Mount, DiskFullPercent)
		}
	}
	if in.probeErr != nil {
		r.Skipped = append(r.Skipped, fmt.Sprintf("the space local volumes use on %s: %v", node, in.probeErr))
		return
	}
	// A directory gives its volume the space it uses; one that no PersistentVolume names is
	// listed as orphaned.
	used := map[string]*int64{}
	for _, u := range in.probe.volumes {
		b := u.bytes
		if pv, ok := byPath[u.path]; ok {
			used[pv.Name] = &b
			continue
		}
		pv, ns, claim := volumeDir(u.path)
		s.Volumes = append(s.Volumes, Volume{Name: pv, Namespace: ns, Claim: claim, Storage: cluster.StorageLocal, UsedBytes: &b, Orphaned: true})
	}
	v.used = used
	for i := range s.Volumes {
		if b, ok := used[s.Volumes[i].Name]; ok && s.Volumes[i].Storage == cluster.StorageLocal {
			s.Volumes[i].UsedBytes = b
		}
	}
}

// longhornDisks describes a Longhorn node's disks, and the schedulable room of its roomiest
// eligible disk (-1 when none is eligible).
func longhornDisks(n *longhornv1beta2.Node, s longhorn.Settings) ([]Disk, int64) {
	names := make([]string, 0, len(n.Spec.Disks))
	for name := range n.Spec.Disks {
		names = append(names, name)
	}
	slices.Sort(names)
	disks := make([]Disk, 0, len(names))
	roomiest := int64(-1)
	for _, name := range names {
		spec, st := n.Spec.Disks[name], n.Status.DiskStatus[name]
		d := Disk{Name: name, Path: spec.Path}
		room := longhorn.Schedulable(spec, st, s)
		eligible := longhorn.DiskEligible(n, spec, st)
		d.SchedulableBytes, d.Eligible = &room, &eligible
		if st != nil {
			d.TotalBytes, d.FreeBytes = st.StorageMaximum, st.StorageAvailable
		}
		if eligible {
			roomiest = max(roomiest, room)
		}
		disks = append(disks, d)
	}
	return disks, roomiest
}

// longhornLow judges a node's roomiest eligible disk: the warning, or "".
func longhornLow(roomiest int64) string {
	switch {
	case roomiest < 0:
		return "no Longhorn disk is eligible for scheduling: new volumes cannot get a copy here"
	case roomiest < LonghornLowBytes:
		return fmt.Sprintf("disk runs low: the roomiest eligible Longhorn disk has %s available for scheduling, less than %s",
			cli.FormatBytes(roomiest), cli.FormatBytes(LonghornLowBytes))
	}
	return ""
}

// longhornStorage reads Longhorn's nodes, settings, volumes and replicas: four requests,
// whatever the number of volumes.
func longhornStorage(ctx context.Context, v *view, storage func(string) *NodeStorage, r *Report) error {
	lh := v.c.Longhorn.LonghornV1beta2()
	nodes, err := lh.Nodes(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list longhorn nodes: %w", err)
	}
	settings, err := longhorn.ReadSettings(ctx, v.c)
	if err != nil {
		return err
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		s := storage(n.Name)
		var roomiest int64
		s.Disks, roomiest = longhornDisks(n, settings)
		if w := longhornLow(roomiest); w != "" {
			s.Low, s.Warning = true, w
		}
	}
	vols, err := lh.Volumes(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list longhorn volumes: %w", err)
	}
	replicas, err := lh.Replicas(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list longhorn replicas: %w", err)
	}
	v.lhVolumes, v.lhReplicas = vols.Items, replicas.Items
	byName := map[string]*longhornv1beta2.Volume{}
	for i := range vols.Items {
		byName[vols.Items[i].Name] = &vols.Items[i]
	}
	servers := map[string]bool{}
	for _, n := range v.servers() {
		servers[n.Name] = true
	}
	for _, c := range longhorn.WorkerReplicas(vols.Items, replicas.Items, func(n string) bool { return servers[n] }) {
		r.WorkerReplicas = append(r.WorkerReplicas, c)
		r.Warnings = append(r.Warnings, c.Sentence())
	}
	for _, u := range longhorn.UnpinnedVolumes(vols.Items, replicas.Items) {
		r.NotPinned = append(r.NotPinned, u)
		r.Warnings = append(r.Warnings, u.Sentence()+": running 'kip upgrade' pins it")
	}
	seen := map[[2]string]bool{}
	for _, rep := range replicas.Items {
		vol, node := byName[rep.Spec.VolumeName], rep.Spec.NodeID
		key := [2]string{node, rep.Spec.VolumeName}
		if vol == nil || node == "" || seen[key] {
			continue
		}
		seen[key] = true
		used := vol.Status.ActualSize
		ks := vol.Status.KubernetesStatus
		out := Volume{Name: cmp.Or(ks.PVName, vol.Name), Namespace: ks.Namespace, Claim: ks.PVCName,
			Storage: cluster.StorageLonghorn, UsedBytes: &used, SizeBytes: vol.Spec.Size}
		s := storage(node)
		s.Volumes = append(s.Volumes, out)
	}
	return nil
}

// componentHealth asks each component the cluster record implies for its state.
func componentHealth(ctx context.Context, v *view, r *Report) []ComponentHealth {
	out := []ComponentHealth{}
	if !v.recorded {
		r.Skipped = append(r.Skipped, "component health: the cluster has no kip cluster record (kip did not install it)")
		return out
	}
	comps, err := recordComponents(v.rec)
	if err != nil {
		r.Warnings = append(r.Warnings, err.Error())
		return out
	}
	// One list per kind for all the components, rather than a few reads each.
	listed := components.ReadListed(ctx, v.c, comps)
	out = make([]ComponentHealth, len(comps))
	for i, comp := range comps {
		ready, pending, err := comp.StatusFrom(listed)
		out[i] = ComponentHealth{Name: comp.Name, Ready: ready && err == nil, Pending: pending}
		if err != nil {
			out[i].Error = err.Error()
		}
	}
	for _, h := range out {
		if !h.Ready {
			r.Warnings = append(r.Warnings, fmt.Sprintf("component %s is not ready: %s", h.Name, cmp.Or(h.Error, h.Pending, "not ready")))
		}
	}
	return out
}

// recordComponents returns the components install would have installed for the record.
func recordComponents(rec cluster.Record) ([]components.Component, error) {
	profile, err := cluster.ProfileNamed(rec.Profile)
	if err != nil {
		return nil, fmt.Errorf("cluster record: %w", err)
	}
	pinned, err := manifests.Pinned()
	if err != nil {
		return nil, err
	}
	o := components.Options{
		Sizing:        cluster.Sizing{Profile: profile, Storage: rec.Storage},
		Monitoring:    rec.Monitoring,
		ServerAddress: rec.Server,
		Pinned:        pinned,
		KipVersion:    rec.KipVersion,
	}
	if rec.Backups == "external" {
		// The components then include Velero on that storage. Its health is its chart's Job and
		// workloads: the bucket and keys, which only the operator has, play no part.
		o.Backups = &components.BackupStorage{Bucket: "recorded", AccessKeyID: "unused", SecretAccessKey: "unused"}
	}
	comps, err := components.Render(o)
	if err != nil {
		return nil, fmt.Errorf("list the cluster's components: %w", err)
	}
	return comps, nil
}
