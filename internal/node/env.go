package node

import (
	"context"
	"fmt"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// Env is what a node command that changes the cluster takes from the command around it.
type Env struct {
	Kube func() (*kube.Clients, error)
	// Server is the saved cluster's server address; "" uses the cluster record's.
	Server string
	// Dial connects to a host over SSH with the cluster's SSH settings.
	Dial        func(ctx context.Context, host string) (*sshx.Client, error)
	Printer     *cli.Printer
	Prompter    *cli.Prompter
	CommandLine string
	KipVersion  string
	Debugf      func(format string, args ...any)
}

// dialServer reaches the cluster's server over SSH; why says what the command needs it for.
func (e Env) dialServer(ctx context.Context, rec cluster.Record, why string) (*sshx.Client, error) {
	h := e.Server
	if h == "" {
		h = rec.Server
	}
	c, err := e.Dial(ctx, h)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", why, err)
	}
	return c, nil
}

// runner runs a node command's workflow under the cluster lock.
func (e Env) runner(cl *kube.Clients, dryRun bool, lock kube.LockOptions) *workflow.Runner {
	r := workflow.OnCluster(cl, e.CommandLine, e.KipVersion, e.Printer)
	r.DryRun, r.Lock = dryRun, workflow.ClusterLock(cl.Kube, lock)
	return r
}
