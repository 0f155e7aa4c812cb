package cluster

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"kipper.run/kip/internal/kube"
)

// The network modes of a cluster's nodes, decided on its first join and kept.
const (
	// ModePrivate: the nodes reach each other over a private IPv4 network they share.
	ModePrivate = "private"
	// ModePublic: the nodes reach each other over their public addresses.
	ModePublic = "public"
)

// Path is how the server and a node reach each other.
type Path struct {
	Mode string `json:"mode"`
	// Network is the private network both addresses are on, zero in public mode.
	Network netip.Prefix `json:"network,omitzero"`
	// Server and Node are the addresses each uses to reach the other.
	Server netip.Addr `json:"server"`
	Node   netip.Addr `json:"node"`
}

func (p Path) String() string {
	if p.Mode == ModePublic {
		return fmt.Sprintf("public addresses (server %s, node %s)", p.Server, p.Node)
	}
	return fmt.Sprintf("private network %s (server %s, node %s)", p.Network, p.Server, p.Node)
}

// Whether a node may hold copies of volumes (kip node add's disk check, kip node storage --copies).
const (
	CopiesEligible   = "eligible"    // the disk passed the check
	CopiesOverridden = "overridden"  // the disk was slow and --ignore-slow-disk accepted it
	CopiesRefused    = "refused"     // the disk failed the check
	CopiesUnchecked  = "not checked" // joined with --no-copies, or the check has not run
)

// MayHoldCopies reports whether a worker whose disk check recorded copies may hold copies of
// volumes: Longhorn places new copies only on such workers (and the server).
func MayHoldCopies(copies string) bool {
	return copies == CopiesEligible || copies == CopiesOverridden
}

// Worker states in the record.
const (
	WorkerJoining  = "joining"
	WorkerReady    = "ready"
	WorkerRemoving = "removing"
)

// Worker is what kip recorded about a worker it joined.
type Worker struct {
	// Host is the address kip reaches the worker at over SSH, as the operator named it; SSHPort
	// and SSHUser how it logs in.
	Host    string `json:"host"`
	SSHPort int    `json:"sshPort"`
	SSHUser string `json:"sshUser"`
	// Path is how the worker and the server reach each other.
	Path Path `json:"path"`
	// FirewallManaged is true when kip manages the worker's host firewall.
	FirewallManaged bool `json:"firewallManaged"`
	// Copies is whether it may hold copies of volumes (Copies*), with CopiesWhy saying why not.
	Copies    string `json:"copies"`
	CopiesWhy string `json:"copiesWhy,omitempty"`
	// CopiesJoin is the join whose disk check set Copies (its verification ID), "" when kip node
	// storage set it: a resumed join finds its check done.
	CopiesJoin string `json:"copiesJoin,omitempty"`
	// State is joining, ready or removing.
	State string `json:"state"`
	// Join is the join (its verification ID) that last recorded the worker joining: that join,
	// run again once it recorded the worker ready, does not record it joining again.
	Join     string    `json:"join,omitempty"`
	JoinedAt time.Time `json:"joinedAt,omitzero"`
	// Fence is set from the moment kip node fence records it until a rejoin lifts it.
	Fence *FenceRecord `json:"fence,omitempty"`
}

// FenceRecord is what kip node fence recorded about a fenced worker: when, the host's boot then, and
// the services and Jobs it stopped, which a rejoin starts again.
type FenceRecord struct {
	At time.Time `json:"at"`
	// BootID is the boot the host ran when fenced (its node's last report when the host did not
	// answer): a rejoin reboots a host still on that boot.
	BootID string `json:"bootID,omitempty"`
	// PoweredOff: the host did not answer, and the operator confirmed it is off.
	PoweredOff bool `json:"poweredOff,omitempty"`
	// CutOff are the Longhorn volumes whose engine ran on the host when it answered kip but could
	// not reach the server's API: their copies elsewhere are not known to be current
	// (longhorn.Distrust) until the worker rejoins.
	CutOff []string `json:"cutOff,omitempty"`
	// Stopped are the services the fence stopped, Suspended the Jobs it suspended.
	Stopped   []StoppedService `json:"stopped,omitempty"`
	Suspended []string         `json:"suspended,omitempty"` // namespace/name
}

// StoppedService is a service a fence stopped, named as service.Ref names it (whose fields it
// spells out: the service package imports this one), and why (longhorn.DataStale or
// DataOnlyThere).
type StoppedService struct {
	Project     string `json:"project"`
	Environment string `json:"environment"`
	Name        string `json:"name"`
	Why         string `json:"why"`
}

// Nodes is the record kipper.run/nodes on kipper-records (format 1): the cluster's network mode
// and the workers kip joined, by node name.
type Nodes struct {
	// Mode is ModePrivate or ModePublic, "" before the first join.
	Mode string `json:"mode,omitempty"`
	// Server is the server's address on the nodes' network (its private address in private
	// mode), which its k3s registers as its node IP; zero before the first join.
	Server  netip.Addr        `json:"server,omitzero"`
	Workers map[string]Worker `json:"workers,omitempty"`
}

// WorkerAddresses are the addresses the recorded workers use on the nodes' network, by node name
// order, except skip's.
func (n Nodes) WorkerAddresses(skip string) []netip.Addr {
	var addrs []netip.Addr
	for _, name := range slices.Sorted(maps.Keys(n.Workers)) {
		if name != skip {
			addrs = append(addrs, n.Workers[name].Path.Node)
		}
	}
	return addrs
}

// The record of the nodes, kipper.run/nodes on kube.ClusterRecords(), and its format.
// PeerAddrs are the addresses of the nodes a recorded worker's firewall admits: the server
// first, then every other recorded worker but skip's, then extra.
func (n Nodes) PeerAddrs(worker, skip string, extra ...netip.Addr) []netip.Addr {
	others := []netip.Addr{n.Server}
	for _, name := range slices.Sorted(maps.Keys(n.Workers)) {
		if name != worker && name != skip {
			others = append(others, n.Workers[name].Path.Node)
		}
	}
	return append(others, extra...)
}

const (
	nodesRecordName    = "nodes"
	nodesRecordVersion = 1
)

// ReadNodes reads the record; a cluster no worker joined yet has an empty one.
func ReadNodes(ctx context.Context, dyn dynamic.Interface) (Nodes, error) {
	rec, _, err := kube.ReadRecord[Nodes](ctx, dyn, kube.ClusterRecords(), nodesRecordName, nodesRecordVersion)
	return rec, err
}

// NodesIn decodes the record from the annotations of kube.ClusterRecords() (see
// kube.ReadAnnotations).
func NodesIn(annotations map[string]string) (Nodes, error) {
	rec, _, err := kube.RecordFrom[Nodes](kube.ClusterRecords(), annotations, nodesRecordName, nodesRecordVersion)
	return rec, err
}

// UpdateWorker changes one recorded worker with mutate, refusing a worker no longer recorded.
func UpdateWorker(ctx context.Context, dyn dynamic.Interface, name string, mutate func(w *Worker)) error {
	_, err := UpdateNodes(ctx, dyn, func(n *Nodes) error {
		w, ok := n.Workers[name]
		if !ok {
			return fmt.Errorf("worker %s is no longer recorded", name)
		}
		mutate(&w)
		n.Workers[name] = w
		return nil
	})
	return err
}

// UpdateNodes changes the record under the API's optimistic concurrency.
func UpdateNodes(ctx context.Context, dyn dynamic.Interface, mutate func(n *Nodes) error) (Nodes, error) {
	return kube.UpdateRecord(ctx, dyn, kube.ClusterRecords(), nodesRecordName, nodesRecordVersion, func(n *Nodes, _ bool) error {
		if n.Workers == nil {
			n.Workers = map[string]Worker{}
		}
		return mutate(n)
	})
}

// WorkerHost is the address kip reaches worker name at, as the operator gave it to kip node add;
// "" when kip keeps no record of that worker.
func WorkerHost(ctx context.Context, cl *kube.Clients, name string) (string, error) {
	workers, err := ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		return "", err
	}
	return workers.Workers[name].Host, nil
}

// CopyHolders are the nodes that can hold a copy of a service's data now, server first: each
// Ready node that may hold copies (the server always; a worker kip recorded ready whose disk
// passed the disk check or was accepted with --ignore-slow-disk). A fenced node is never Ready.
func CopyHolders(ctx context.Context, cl *kube.Clients) ([]string, error) {
	nodes, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	workers, err := ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		return nil, err
	}
	var holders []*corev1.Node
	for i := range nodes.Items {
		n := &nodes.Items[i]
		w := workers.Workers[n.Name]
		if NodeStatus(n) == NodeReady && (NodeRole(n) == RoleServer || w.State == WorkerReady && MayHoldCopies(w.Copies)) {
			holders = append(holders, n)
		}
	}
	slices.SortFunc(holders, func(a, b *corev1.Node) int {
		return cmp.Or(cmp.Compare(RoleOrder(NodeRole(a)), RoleOrder(NodeRole(b))), cmp.Compare(a.Name, b.Name))
	})
	var names []string
	for _, n := range holders {
		names = append(names, n.Name)
	}
	return names, nil
}
