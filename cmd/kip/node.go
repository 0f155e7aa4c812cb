package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/node"
)

func newNodeCmd(f *cli.Factory, list func(*node.ListOptions) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "List the cluster's nodes",
		Long: `The cluster's nodes: the server, which runs the control plane and ingress and holds database,
registry and in-cluster backup volumes, and the workers kip joined. See docs/nodes.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newNodeListCmd(f, list))
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
