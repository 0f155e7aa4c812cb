package node

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
)

// NodeMissing is the status of a recorded worker that has no Node in the cluster.
const NodeMissing = "Missing"

// ListOptions are kip node list's.
type ListOptions struct {
	// Kube returns the cluster's API clients.
	Kube func() (*kube.Clients, error)
	// JSON writes the list as JSON (-o json) to Out.
	JSON bool
	Out  io.Writer
}

// Listed is one node of kip node list: the Kubernetes node as kip shows it, and, for the server
// and the workers kip joined, what kip recorded about it.
type Listed struct {
	cluster.NodeInfo
	// Recorded is false for a worker kip did not join (the Node exists, the record does not).
	Recorded bool `json:"recorded"`
	// State is the recorded worker's state (joining, ready, removing); "" for the server.
	State string `json:"state,omitempty"`
	// Mode is how it reaches the server (private or public), Copies whether it may hold copies of
	// volumes, SSH where kip reaches it; empty for an unrecorded worker and on a cluster no worker
	// joined.
	Mode      string `json:"mode,omitempty"`
	Address   string `json:"address,omitempty"`
	Copies    string `json:"copies,omitempty"`
	CopiesWhy string `json:"copiesWhy,omitempty"`
	SSH       string `json:"ssh,omitempty"`
}

// List lists every node with its role, status and address; once a worker is recorded, also each
// node's network mode, whether it may hold copies of volumes and its SSH address.
func List(ctx context.Context, o *ListOptions) error {
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	rec, err := cluster.ReadInstalled(ctx, cl.Dynamic)
	if err != nil {
		return err
	}
	nodes, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	workers, err := cluster.ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		return err
	}
	out := listed(rec, workers, nodes.Items)
	if o.JSON {
		return cli.WriteJSON(o.Out, out)
	}
	writeList(o.Out, out, len(workers.Workers) > 0)
	return nil
}

// listed joins the Nodes with the record: the server first, then workers by name; a recorded
// worker without a Node is listed as Missing.
func listed(rec cluster.Record, workers cluster.Nodes, nodes []corev1.Node) []Listed {
	out := []Listed{}
	seen := map[string]bool{}
	for i := range nodes {
		l := Listed{NodeInfo: cluster.Info(&nodes[i])}
		seen[l.Name] = true
		if l.Role == cluster.RoleServer {
			l.Recorded, l.SSH, l.Copies = true, rec.Server, cluster.CopiesEligible
			if len(workers.Workers) > 0 {
				l.Mode = workers.Mode
			}
		} else if w, ok := workers.Workers[l.Name]; ok {
			l.recorded(w)
		}
		out = append(out, l)
	}
	for name, w := range workers.Workers {
		if !seen[name] {
			l := Listed{NodeInfo: cluster.NodeInfo{Name: name, Role: cluster.RoleWorker, Status: NodeMissing}}
			l.recorded(w)
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b Listed) int {
		return cmp.Or(cmp.Compare(cluster.RoleOrder(a.Role), cluster.RoleOrder(b.Role)), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func (l *Listed) recorded(w cluster.Worker) {
	l.Recorded, l.State, l.Mode, l.Copies, l.CopiesWhy = true, w.State, w.Path.Mode, cmp.Or(w.Copies, cluster.CopiesUnchecked), w.CopiesWhy
	if w.Path.Node.IsValid() {
		l.Address = w.Path.Node.String()
	}
	l.SSH = w.Host
	if w.SSHPort != 0 && w.SSHPort != 22 {
		l.SSH += ":" + strconv.Itoa(w.SSHPort)
	}
}

// statusText is a node's status as kubectl words it (Ready,SchedulingDisabled), with a recorded
// worker's state when it is not ready.
func (l Listed) statusText() string {
	words := []string{l.Status}
	if l.Unschedulable {
		words = append(words, "SchedulingDisabled")
	}
	if l.State != "" && l.State != cluster.WorkerReady {
		words = append(words, l.State)
	}
	return strings.Join(words, ",")
}

func writeList(w io.Writer, nodes []Listed, recorded bool) {
	header := []string{"NAME", "ROLE", "STATUS", "ADDRESS", "K3S"}
	if recorded {
		header = append(header, "MODE", "COPIES", "SSH")
	}
	rows := make([][]string, 0, len(nodes))
	var notes []string
	for _, n := range nodes {
		addr := cmp.Or(n.Address, n.InternalIP)
		row := []string{n.Name, n.Role, n.statusText(), cli.OrDash(addr), cli.OrDash(n.K3sVersion)}
		if recorded {
			row = append(row, cli.OrDash(n.Mode), cli.OrDash(n.Copies), cli.OrDash(n.SSH))
		}
		rows = append(rows, row)
		switch {
		case !n.Recorded:
			notes = append(notes, fmt.Sprintf("Worker %s was not joined by kip: kip has no record of how to reach it", n.Name))
		case n.Status == NodeMissing:
			notes = append(notes, fmt.Sprintf("Worker %s is recorded (%s) but has no node in the cluster", n.Name, n.SSH))
		case n.CopiesWhy != "":
			notes = append(notes, fmt.Sprintf("Worker %s: copies %s: %s", n.Name, n.Copies, n.CopiesWhy))
		}
	}
	cli.WriteTable(w, "Nodes", "none", header, rows)
	for _, n := range notes {
		fmt.Fprintln(w, "  "+n)
	}
}
