package main

import (
	"context"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/node"
)

// nodeRunners replace what kip node's subcommands run, for tests; nil fields run the real thing.
type nodeRunners struct {
	list    func(*node.ListOptions) error
	add     func(*node.AddOptions) error
	remove  func(*node.RemoveOptions) error
	reboot  func(*node.RebootOptions) error
	fence   func(*node.FenceOptions) error
	storage func(*node.StorageOptions) error
}

func newNodeCmd(f *cli.Factory, run nodeRunners) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Add, list, reboot, fence and remove the cluster's nodes, and check their disks",
		Long: `The cluster's nodes: the server, which runs the control plane and ingress and holds database,
registry and in-cluster backup volumes, and the workers kip joined. See docs/nodes.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newNodeAddCmd(f, run.add), newNodeListCmd(f, run.list), newNodeRemoveCmd(f, run.remove), newNodeRebootCmd(f, run.reboot), newNodeFenceCmd(f, run.fence),
		newNodeStorageCmd(f, run.storage))
	return cmd
}

func newNodeAddCmd(f *cli.Factory, runF func(*node.AddOptions) error) *cobra.Command {
	o := &node.AddOptions{}
	var firewall bool
	cmd := &cobra.Command{
		Use:   "add HOST",
		Short: "Join a host to the cluster as a worker, or rejoin one",
		Long: `Join a host to the cluster as a worker over SSH. kip checks the host, prepares its kernel
modules, Longhorn's packages, host hardening and firewall, joins it as a k3s agent at the
server's k3s version, and keeps ordinary new workloads off it with a taint while it checks
cluster DNS, the server's API, the cluster registry, the kubelet and Longhorn's storage there.
A node already in the cluster is cordoned for the checks instead, its running workloads left in
place.

The first join decides how the nodes reach each other, for the whole cluster: over a private
network both hosts share (found in their routing tables, then checked by connecting both ways),
or over public addresses with --public or when they share none. A private network that carries
the default route is named with --private-network. Moving the server onto the private network
restarts k3s on it, after asking (--yes approves). Interrupted, the same command with the same
options resumes. See docs/nodes.md.`,
		Example: `  kip node add 203.0.113.11
  kip node add 10.0.2.11 --private-network 10.0.0.0/16
  kip node add 198.51.100.7 --public --yes
  kip node add 203.0.113.11 --airgap-bundle ./k3s-v1.37.2+k3s1`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Host = args[0]
			if cmd.Flags().Changed("firewall") {
				o.Firewall = &firewall
			}
			var err error
			if o.Env, err = nodeEnv(f); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return node.Add(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.PrivateNetwork, "private-network", "", "the private IPv4 network the nodes share, when it carries the default route (e.g. 10.0.0.0/16)")
	fs.BoolVar(&o.Public, "public", false, "join over public addresses, even when the hosts share a private network")
	fs.BoolVar(&firewall, "firewall", false, "manage the new node's host firewall (default: when kip manages the server's); --firewall=false leaves it to you")
	fs.BoolVar(&o.NoCopies, "no-copies", false, "keep copies of volumes off this worker (skips the disk check)")
	fs.StringVar(&o.AirgapBundle, "airgap-bundle", "", "directory with the k3s release's binary and sha256sum file, uploaded instead of downloaded")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print the plan and change nothing")
	return cmd
}

func newNodeListCmd(f *cli.Factory, runF func(*node.ListOptions) error) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every node with its role, status and address",
		Long: `List every node with its role, status (Ready, NotReady, Unknown, or OutOfService for a fenced
node, which never counts as Ready) and address. Once a worker is recorded, the list also shows
each node's network mode (private or public), whether it may hold copies of volumes, and the
address kip reaches it at over SSH. A worker kip did not join is listed as not recorded.`,
		Example: "  kip node list\n  kip node list -o json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			o := &node.ListOptions{Kube: f.Kube, JSON: f.Global.Output == cli.OutputJSON, Out: f.IO.Out}
			if runF != nil {
				return runF(o)
			}
			return node.List(cmd.Context(), o)
		},
	}
}

func newNodeRemoveCmd(f *cli.Factory, runF func(*node.RemoveOptions) error) *cobra.Command {
	o := &node.RemoveOptions{}
	cmd := &cobra.Command{
		Use:   "remove WORKER",
		Short: "Take a worker out of the cluster",
		Long: `Take a worker out of the cluster. kip has Longhorn move the volume copies on it to other nodes,
drains it (every pod is evicted, respecting PodDisruptionBudgets; DaemonSet pods stay; emptyDir
data is deleted; a pod no controller manages cancels the remove before anything changes) and
waits until its volumes have detached, wipes k3s, its containers and Longhorn's data from the host, deletes the node, and removes the
worker's address from every firewall kip manages. For a firewall you manage, it lists the
rules to remove. The worker must be Ready and answer over SSH.

--force deregisters a worker whose host is powered off or gone for good: nothing is moved or
drained, its pods are deleted with the node and the copies of volumes on it are lost. A host
that still answers is removed with --force only while a fence holds its k3s-agent stopped.
Interrupted, the same command resumes. See docs/nodes.md.`,
		Example: "  kip node remove lab12\n  kip node remove lab12 --force --yes",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE:    workerRunE(f, o, &o.Worker, &o.Env, runF, node.Remove),
	}
	fs := cmd.Flags()
	fs.BoolVar(&o.Force, "force", false, "deregister a worker whose host is powered off or gone, without moving its copies or draining it")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print the plan and change nothing")
	return cmd
}

func newNodeRebootCmd(f *cli.Factory, runF func(*node.RebootOptions) error) *cobra.Command {
	o := &node.RebootOptions{}
	cmd := &cobra.Command{
		Use:   "reboot WORKER",
		Short: "Reboot a worker, its workloads moved off and waited for",
		Long: `Reboot a worker. kip takes a backup of every Kipper project and waits until it is a completed
backup, has Longhorn move the only current copy of any volume from the worker to the server
(which must have room for them), drains the worker (every pod is evicted, respecting PodDisruptionBudgets; DaemonSet
pods stay; emptyDir data is deleted; finished pods are deleted) and waits until its volumes have detached, reboots the host, waits until
its node is Ready on the new boot, uncordons it, and waits until every Deployment, StatefulSet
and DaemonSet that had a Ready pod on it has rolled out again.

It cancels before anything changes when the worker is the server, was not joined by kip, is
still joining or being removed, is fenced, is not Ready, runs a pod no controller manages (a
drain would delete it for good), or holds the only current copy of a Longhorn volume while the
server has no room for it (or that copy failed too); and, on a cluster without backups, unless
--no-backup. Interrupted, the same command resumes. See
docs/nodes.md.`,
		Example: "  kip node reboot lab12\n  kip node reboot lab12 --no-backup --yes",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE:    workerRunE(f, o, &o.Worker, &o.Env, runF, node.Reboot),
	}
	fs := cmd.Flags()
	fs.BoolVar(&o.NoBackup, "no-backup", false, "reboot without a backup first (a cluster without backups needs it)")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print the plan and change nothing")
	return cmd
}

func newNodeFenceCmd(f *cli.Factory, runF func(*node.FenceOptions) error) *cobra.Command {
	o := &node.FenceOptions{}
	cmd := &cobra.Command{
		Use:   "fence WORKER",
		Short: "Fence a worker that stopped reporting, so its services can start elsewhere",
		Long: `Fence a worker that has been NotReady for at least a minute and that you know is down, so that
other nodes can take over its services' volumes without two hosts writing one volume.

kip records the fence first, so an interrupted fence resumes when run again. If the worker
still answers over SSH, kip installs a systemd drop-in that keeps k3s-agent from starting, also
after a reboot, stops k3s and every container there, and checks that no container, Longhorn
process or Longhorn mount is left. If it does not answer, kip asks you to confirm that the host
is powered off and stays off until it rejoins (--powered-off confirms it without a prompt), and
refuses while the worker's kubelet still answers the server at the worker's recorded address.

Each Kipper service with a single-node volume on the worker starts on another node only when
another node holds a current copy of every one of its volumes (a copy healthy since it last
failed). One whose other copies may be older stays stopped unless you accept the older data
(kip shows every copy with its timestamps and asks on a terminal, or --accept-stale-data); one
whose only copy is on the worker stays stopped until the worker rejoins. Jobs whose pods hold
single-node volumes there are suspended. kip then taints the node
node.kubernetes.io/out-of-service, so Kubernetes deletes its pods and detaches their volumes,
and a minute later deletes the Kipper pods with Longhorn volumes still left there, only while
the node is still NotReady and tainted and their volumes are detached from it.

A fenced worker stays out of service until kip node add rejoins it or kip node remove --force
gives it up; kip service start starts a service the fence stopped, with the same check. See
docs/nodes.md.`,
		Example: "  kip node fence lab12\n  kip node fence lab12 --powered-off --yes\n  kip node fence lab12 --powered-off --accept-stale-data --yes",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE:    workerRunE(f, o, &o.Worker, &o.Env, runF, node.Fence),
	}
	fs := cmd.Flags()
	fs.BoolVar(&o.PoweredOff, "powered-off", false, "confirm that the worker's host, which does not answer over SSH, is powered off and stays off until it rejoins")
	fs.BoolVar(&o.AcceptStale, "accept-stale-data", false, "let a service whose other copies may be older start on them")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print the plan and change nothing")
	return cmd
}

func newNodeStorageCmd(f *cli.Factory, runF func(*node.StorageOptions) error) *cobra.Command {
	o := &node.StorageOptions{}
	cmd := &cobra.Command{
		Use:   "storage WORKER --copies",
		Short: "Check whether a worker's disk may hold copies of volumes",
		Long: `With --copies, repeat the disk check kip node add runs at the end of each join (unless
--no-copies): kip measures how long the disk under /var/lib/longhorn takes to sync small writes
(8 batches of 16 writes of 4 KiB, each synced before the next), because a copy on a slow disk
stalls every write to its volume. A disk whose writes take more than 5ms each on average is
slow: local SSD and NVMe disks pass, network block storage is usually refused. --ignore-slow-disk
accepts a slow disk and records the override, except when a batch stalls for half of Longhorn's
replica timeout (engine-replica-timeout, 8 seconds by default) or longer. The result is recorded
and shown by kip node list; the server may always hold copies. See docs/nodes.md.`,
		Example: "  kip node storage lab12 --copies\n  kip node storage lab12 --copies --ignore-slow-disk",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE:    workerRunE(f, o, &o.Worker, &o.Env, runF, node.Storage),
	}
	fs := cmd.Flags()
	fs.BoolVar(&o.Copies, "copies", false, "check whether the worker's disk may hold copies of volumes")
	fs.BoolVar(&o.IgnoreSlowDisk, "ignore-slow-disk", false, "accept a slow disk (recorded as an override), unless it stalls for half of Longhorn's replica timeout")
	return cmd
}

// workerRunE runs a node command on one worker: WORKER and the node environment set on its
// options o, then run (or the test's runF).
func workerRunE[O any](f *cli.Factory, o *O, worker *string, env *node.Env, runF func(*O) error,
	run func(context.Context, *O) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		*worker = args[0]
		var err error
		if *env, err = nodeEnv(f); err != nil {
			return err
		}
		if runF != nil {
			return runF(o)
		}
		return run(cmd.Context(), o)
	}
}

// nodeEnv is what the node commands that change the cluster take from the command line.
func nodeEnv(f *cli.Factory) (node.Env, error) {
	server, dial, err := hostDialer(f)
	if err != nil {
		return node.Env{}, err
	}
	return node.Env{Kube: f.Kube, Server: server, Dial: dial, Printer: f.Printer(), Prompter: f.Prompter(),
		CommandLine: f.CommandLine(), KipVersion: buildinfo.Version, Debugf: f.Debugf}, nil
}
