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
		root.AddCommand(newNodeCmd(f, func(o *node.ListOptions) error { got = o; return nil }))
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
