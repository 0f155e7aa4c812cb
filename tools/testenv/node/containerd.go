//go:build !testenv_older

package main

import (
	"context"
	"fmt"
	"os"

	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctr "github.com/containerd/containerd/v2/cmd/ctr/app"
)

// containerd v2.4.2 is built against the k8s.io modules of Kubernetes 1.37 (its CRI plugin needs
// k8s.io/streaming and k8s.io/cri-streaming at v0.37), so the older release's module graph
// (go.older.mod) does not hold it: the tag testenv_older leaves this file out.
func init() {
	commands["containerd"] = func() int { return urfave("containerd", command.App().Run) }
	commands["ctr"] = func() int { return urfave("ctr", ctr.New().Run) }
}

// urfave runs a command of containerd's (urfave/cli) as its main does.
func urfave(name string, run func(context.Context, []string) error) int {
	if err := run(context.Background(), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	return 0
}
