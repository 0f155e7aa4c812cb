package main

import (
	"errors"
	"testing"

	"kipper.run/kip/internal/cli"
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
		root := newRootCmd(f)
		for _, c := range root.Commands() {
			if c.Name() == "node" {
				root.RemoveCommand(c)
			}
		}
		root.AddCommand(newNodeCmd(f, nodeRunners{list: func(o *node.ListOptions) error { got = o; return nil }}))
		root.SetArgs(append([]string{"node", "list"}, tt.args...))
		if err := root.Execute(); err != nil {
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

// TestNodeRemoveWiring checks what kip node remove hands to internal/node, and that it takes
// exactly one worker.
func TestNodeRemoveWiring(t *testing.T) {
	for _, tt := range []struct {
		args        []string
		force, dry  bool
		description string
	}{{[]string{"w1"}, false, false, "defaults"}, {[]string{"w1", "--force", "--dry-run"}, true, true, "flags"}} {
		f, _, _ := testFactory(nil)
		var got *node.RemoveOptions
		root := newRootCmd(f)
		for _, c := range root.Commands() {
			if c.Name() == "node" {
				root.RemoveCommand(c)
			}
		}
		root.AddCommand(newNodeCmd(f, nodeRunners{remove: func(o *node.RemoveOptions) error { got = o; return nil }}))
		root.SetArgs(append([]string{"node", "remove"}, tt.args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("%s: %v", tt.description, err)
		}
		if got == nil || got.Worker != "w1" || got.Force != tt.force || got.DryRun != tt.dry || got.Kube == nil || got.Dial == nil || got.Prompter == nil {
			t.Errorf("%s: options %+v", tt.description, got)
		}
	}
	for _, args := range [][]string{{"node", "remove"}, {"node", "remove", "w1", "w2"}} {
		f, _, _ := testFactory(nil)
		root := newRootCmd(f)
		root.SetArgs(args)
		if err := root.Execute(); !errors.As(err, new(*cli.UsageError)) {
			t.Errorf("kip %v = %v, want a usage error", args, err)
		}
	}
	f, _, _ := testFactory(nil)
	if err := node.Remove(t.Context(), &node.RemoveOptions{Worker: "Not_A_Node", Env: node.Env{Prompter: f.Prompter()}}); !errors.As(err, new(*cli.UsageError)) {
		t.Errorf("kip node remove Not_A_Node = %v, want a usage error", err)
	}
}

// TestNodeRebootWiring checks what kip node reboot hands to internal/node, and that it takes
// exactly one worker.
func TestNodeRebootWiring(t *testing.T) {
	for _, tt := range []struct {
		args          []string
		noBackup, dry bool
		description   string
	}{{[]string{"w1"}, false, false, "defaults"}, {[]string{"w1", "--no-backup", "--dry-run"}, true, true, "flags"}} {
		f, _, _ := testFactory(nil)
		var got *node.RebootOptions
		root := newRootCmd(f)
		for _, c := range root.Commands() {
			if c.Name() == "node" {
				root.RemoveCommand(c)
			}
		}
		root.AddCommand(newNodeCmd(f, nodeRunners{reboot: func(o *node.RebootOptions) error { got = o; return nil }}))
		root.SetArgs(append([]string{"node", "reboot"}, tt.args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("%s: %v", tt.description, err)
		}
		if got == nil || got.Worker != "w1" || got.NoBackup != tt.noBackup || got.DryRun != tt.dry || got.Kube == nil || got.Dial == nil || got.Prompter == nil {
			t.Errorf("%s: options %+v", tt.description, got)
		}
	}
	for _, args := range [][]string{{"node", "reboot"}, {"node", "reboot", "w1", "w2"}} {
		f, _, _ := testFactory(nil)
		root := newRootCmd(f)
		root.SetArgs(args)
		if err := root.Execute(); !errors.As(err, new(*cli.UsageError)) {
			t.Errorf("kip %v = %v, want a usage error", args, err)
		}
	}
	f, _, _ := testFactory(nil)
	if err := node.Reboot(t.Context(), &node.RebootOptions{Worker: "Not_A_Node", Env: node.Env{Prompter: f.Prompter()}}); !errors.As(err, new(*cli.UsageError)) {
		t.Errorf("kip node reboot Not_A_Node = %v, want a usage error", err)
	}
}
