package node

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// workerCommand is one run of a node command that acts on one recorded worker (remove, reboot):
// checked before anything changes, asked about, then run as a resumable workflow under the
// cluster lock.
type workerCommand struct {
	verb   string // the subcommand, for the cancellation message
	worker string
	dryRun bool
	// examine reads the cluster and refuses what the command refuses; it returns the clients
	// the workflow runs with.
	examine  func(context.Context) (*kube.Clients, error)
	question func(context.Context) string
	workflow func() *workflow.Workflow
}

// runWorkerCommand runs c: WORKER checked as a node name, the operator able to answer (unless a
// dry run), c's checks, its question, then its workflow.
func (e Env) runWorkerCommand(ctx context.Context, c workerCommand) error {
	if err := checkWorkerName(c.worker); err != nil {
		return err
	}
	if !c.dryRun {
		if err := e.Prompter.CanConfirm(); err != nil {
			return err
		}
	}
	cl, err := c.examine(ctx)
	if err != nil {
		return err
	}
	if !c.dryRun {
		ok, err := e.Prompter.Confirm(c.question(ctx))
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("node " + c.verb + " cancelled: nothing was changed")
		}
	}
	return e.runner(cl, c.dryRun, kube.LockOptions{}).Run(ctx, c.workflow())
}

// checkWorkerName refuses a WORKER argument that is no node name.
func checkWorkerName(name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return cli.Usagef("WORKER %q is no node name (%s): kip node list shows the nodes", name, strings.Join(errs, "; "))
	}
	return nil
}

// workerTarget is what a command on one recorded worker reads first.
type workerTarget struct {
	cl     *kube.Clients
	rec    cluster.Record
	nodes  cluster.Nodes
	worker cluster.Worker
	node   *corev1.Node // nil when the API has no Node of that name
}

// readWorker reads the cluster record, the nodes record, the recorded worker name and its Node,
// refusing the server (what says what the command does instead), a worker kip did not record
// and a name no node has.
func readWorker(ctx context.Context, clients func() (*kube.Clients, error), name, what string) (workerTarget, error) {
	var t workerTarget
	var err error
	if t.cl, err = clients(); err != nil {
		return t, err
	}
	if t.rec, err = cluster.ReadInstalled(ctx, t.cl.Dynamic); err != nil {
		return t, err
	}
	if t.nodes, err = cluster.ReadNodes(ctx, t.cl.Dynamic); err != nil {
		return t, err
	}
	n, err := t.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return t, fmt.Errorf("read node %s: %w", name, err)
	default:
		t.node = n
	}
	w, recorded := t.nodes.Workers[name]
	switch {
	case recorded:
		t.worker = w
		return t, nil
	case t.node != nil && cluster.NodeRole(t.node) == cluster.RoleServer:
		return t, fmt.Errorf("%s is the cluster's server: %s", name, what)
	case t.node != nil:
		return t, fmt.Errorf("node %s is a worker kip did not record, so kip does not know its host: adopt it with kip node add <its host> first, then run the same command again", name)
	}
	return t, noWorkerError(name)
}

// noWorkerError is readWorker's refusal of a name that is neither a recorded worker nor a node.
type noWorkerError string

func (e noWorkerError) Error() string {
	return "the cluster has no worker " + string(e) + ": kip node list shows its nodes"
}
