package main

import (
	"context"
	"errors"
	"testing"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/node"
)

// TestNodeListWiring checks what kip node list hands to internal/node, and that it takes no
// arguments.
func TestNodeListWiring(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		wantJSON bool
	}{{nil, false}, {[]string{"-o", "json"}, true}} {
		f, _, _ := testFactory(nil)
		var got *node.ListOptions
		if err := executeWith(f, append([]string{"node", "list"}, tt.args...), func(f *cli.Factory) *cobra.Command {
			return newNodeCmd(f, nodeRunners{list: func(o *node.ListOptions) error { got = o; return nil }})
		}); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got == nil || got.JSON != tt.wantJSON || got.Out != f.IO.Out || got.Kube == nil {
			t.Errorf("%v: options %+v", tt.args, got)
		}
	}
	f, _, _ := testFactory(nil)
	root := newRootCmd(f)
	root.SetArgs([]string{"node", "list", "w1"})
	if err := root.Execute(); !errors.As(err, new(*cli.UsageError)) {
		t.Errorf("kip node list w1 = %v, want a usage error", err)
	}
}

// TestNodeAddWiring checks what kip node add hands to internal/node: the host, the flags, and
// --firewall only when given.
func TestNodeAddWiring(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		check    func(o *node.AddOptions) bool
		describe string
	}{
		{[]string{"203.0.113.11"}, func(o *node.AddOptions) bool {
			return o.Host == "203.0.113.11" && o.Firewall == nil && !o.Public && o.PrivateNetwork == "" && !o.NoCopies && !o.DryRun
		}, "defaults"},
		{[]string{"w1", "--private-network", "10.0.0.0/16", "--no-copies", "--firewall=false", "--dry-run"}, func(o *node.AddOptions) bool {
			return o.Host == "w1" && o.PrivateNetwork == "10.0.0.0/16" && o.NoCopies && o.Firewall != nil && !*o.Firewall && o.DryRun
		}, "flags"},
		{[]string{"w1", "--public", "--firewall"}, func(o *node.AddOptions) bool {
			return o.Public && o.Firewall != nil && *o.Firewall
		}, "--public --firewall"},
	} {
		f, _, _ := testFactory(nil)
		var got *node.AddOptions
		root := newRootCmd(f)
		for _, c := range root.Commands() {
			if c.Name() == "node" {
				root.RemoveCommand(c)
			}
		}
		root.AddCommand(newNodeCmd(f, nodeRunners{add: func(o *node.AddOptions) error { got = o; return nil }}))
		root.SetArgs(append([]string{"node", "add"}, tt.args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("%s: %v", tt.describe, err)
		}
		if got == nil || !tt.check(got) || got.Kube == nil || got.Dial == nil || got.Printer == nil || got.Prompter == nil {
			t.Errorf("%s: options %+v", tt.describe, got)
		}
	}
	f, _, _ := testFactory(nil)
	root := newRootCmd(f)
	root.SetArgs([]string{"node", "add"})
	if err := root.Execute(); !errors.As(err, new(*cli.UsageError)) {
		t.Errorf("kip node add without a host = %v, want a usage error", err)
	}
}

// TestNodeWorkerCommandsWiring checks what kip node remove, reboot and fence hand to internal/node,
// and that each takes exactly one worker.
func TestNodeWorkerCommandsWiring(t *testing.T) {
	type got struct {
		worker     string
		flag, dry  bool
		kube, dial bool
	}
	for _, cmd := range []struct {
		name, flag string
		runners    func(*got) nodeRunners
		run        func(ctx context.Context, f *cli.Factory, worker string) error
	}{
		{"remove", "--force", func(g *got) nodeRunners {
			return nodeRunners{remove: func(o *node.RemoveOptions) error {
				*g = got{o.Worker, o.Force, o.DryRun, o.Kube != nil, o.Dial != nil && o.Prompter != nil}
				return nil
			}}
		}, func(ctx context.Context, f *cli.Factory, worker string) error {
			return node.Remove(ctx, &node.RemoveOptions{Worker: worker, Env: node.Env{Prompter: f.Prompter()}})
		}},
		{"reboot", "--no-backup", func(g *got) nodeRunners {
			return nodeRunners{reboot: func(o *node.RebootOptions) error {
				*g = got{o.Worker, o.NoBackup, o.DryRun, o.Kube != nil, o.Dial != nil && o.Prompter != nil}
				return nil
			}}
		}, func(ctx context.Context, f *cli.Factory, worker string) error {
			return node.Reboot(ctx, &node.RebootOptions{Worker: worker, Env: node.Env{Prompter: f.Prompter()}})
		}},
		{"fence", "--powered-off", func(g *got) nodeRunners {
			return nodeRunners{fence: func(o *node.FenceOptions) error {
				*g = got{o.Worker, o.PoweredOff, o.DryRun, o.Kube != nil, o.Dial != nil && o.Prompter != nil}
				return nil
			}}
		}, func(ctx context.Context, f *cli.Factory, worker string) error {
			return node.Fence(ctx, &node.FenceOptions{Worker: worker, Env: node.Env{Prompter: f.Prompter()}})
		}},
	} {
		for _, tt := range []struct {
			args      []string
			flag, dry bool
		}{{[]string{"w1"}, false, false}, {[]string{"w1", cmd.flag, "--dry-run"}, true, true}} {
			f, _, _ := testFactory(nil)
			var g got
			root := newRootCmd(f)
			for _, c := range root.Commands() {
				if c.Name() == "node" {
					root.RemoveCommand(c)
				}
			}
			root.AddCommand(newNodeCmd(f, cmd.runners(&g)))
			root.SetArgs(append([]string{"node", cmd.name}, tt.args...))
			if err := root.Execute(); err != nil {
				t.Fatalf("kip node %s %v: %v", cmd.name, tt.args, err)
			}
			if want := (got{"w1", tt.flag, tt.dry, true, true}); g != want {
				t.Errorf("kip node %s %v: options %+v, want %+v", cmd.name, tt.args, g, want)
			}
		}
		for _, args := range [][]string{{"node", cmd.name}, {"node", cmd.name, "w1", "w2"}} {
			f, _, _ := testFactory(nil)
			root := newRootCmd(f)
			root.SetArgs(args)
			if err := root.Execute(); !errors.As(err, new(*cli.UsageError)) {
				t.Errorf("kip %v = %v, want a usage error", args, err)
			}
		}
		f, _, _ := testFactory(nil)
		if err := cmd.run(t.Context(), f, "Not_A_Node"); !errors.As(err, new(*cli.UsageError)) {
			t.Errorf("kip node %s Not_A_Node = %v, want a usage error", cmd.name, err)
		}
	}
}

// TestNodeStorageWiring checks what kip node storage hands to internal/node, and that without
// --copies, or with a WORKER that is no node name, it is a usage error before anything connects.
func TestNodeStorageWiring(t *testing.T) {
	for _, tt := range []struct {
		args               []string
		copies, ignoreSlow bool
	}{{[]string{"w1", "--copies"}, true, false}, {[]string{"w1", "--copies", "--ignore-slow-disk"}, true, true}} {
		f, _, _ := testFactory(nil)
		var got *node.StorageOptions
		root := newRootCmd(f)
		for _, c := range root.Commands() {
			if c.Name() == "node" {
				root.RemoveCommand(c)
			}
		}
		root.AddCommand(newNodeCmd(f, nodeRunners{storage: func(o *node.StorageOptions) error { got = o; return nil }}))
		root.SetArgs(append([]string{"node", "storage"}, tt.args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got == nil || got.Worker != "w1" || got.Copies != tt.copies || got.IgnoreSlowDisk != tt.ignoreSlow || got.Kube == nil || got.Dial == nil {
			t.Errorf("%v: options %+v", tt.args, got)
		}
	}
	for _, worker := range []string{"w1", "Not_A_Node"} {
		f, _, _ := testFactory(nil)
		kube := func() (*kube.Clients, error) { return nil, errors.New("no cluster is reached in this test") }
		err := node.Storage(t.Context(), &node.StorageOptions{Worker: worker, Env: node.Env{Kube: kube, Printer: f.Printer()}})
		if !errors.As(err, new(*cli.UsageError)) {
			t.Errorf("kip node storage %s without --copies = %v, want a usage error", worker, err)
		}
	}
}
