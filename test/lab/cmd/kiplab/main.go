// Command kiplab manages kip's lab hosts for people (the tests use package lab directly):
//
//	kiplab image                     build the base image, or reuse the cached one
//	kiplab up [-memory MiB] [-cpus N] [-modules M,...] [-longhorn-disk GiB] N
//	                                 bring up N hosts that stay up after kiplab exits
//	kiplab status                    list the hosts of the lab that is up
//	kiplab down [-routes]            remove the lab (-routes: the unreachable routes too)
//
// It runs as root. The Makefile's lab-image, lab-up and lab-down targets call it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"kipper.run/kip/test/lab"
)

const usage = `usage: kiplab image | up [-memory MiB] [-cpus N] [-modules M,...] [-longhorn-disk GiB] N | status | down [-routes]`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiplab:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }
	fs := flag.NewFlagSet("kiplab "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "image":
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		path, err := lab.EnsureImage(ctx, logf)
		if err != nil {
			return err
		}
		fmt.Println(path)
		return nil
	case "up":
		memory := fs.Int("memory", 0, "MemTotal of every host in MiB (0: this machine's)")
		cpus := fs.Int("cpus", 0, "CPU count of every host (0: this machine's)")
		modules := fs.String("modules", "", "comma-separated kernel modules every host pretends it can load, e.g. br_netfilter,wireguard")
		longhorn := fs.Int("longhorn-disk", 0, "size in GiB of the file system every host gets at /var/lib/longhorn, on a sparse image (0: none)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return errors.New(usage)
		}
		n, err := strconv.Atoi(fs.Arg(0))
		if err != nil {
			return fmt.Errorf("host count %q: %w", fs.Arg(0), err)
		}
		opts := lab.Options{Persistent: true, Logf: logf}
		for range n {
			h := lab.HostOptions{MemoryMiB: *memory, CPUs: *cpus, LonghornDiskGiB: *longhorn}
			if *modules != "" {
				h.Modules = strings.Split(*modules, ",")
			}
			opts.Hosts = append(opts.Hosts, h)
		}
		l, err := lab.Up(ctx, n, opts)
		if err != nil {
			return err
		}
		printHosts(l)
		return nil
	case "status":
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		l, err := lab.Attach()
		if err != nil {
			return err
		}
		printHosts(l)
		return nil
	case "down":
		routes := fs.Bool("routes", false, "also remove the unreachable routes for the lab's ranges")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if err := lab.Teardown(ctx); err != nil {
			return err
		}
		if *routes {
			return lab.RemoveRoutes(ctx)
		}
		return nil
	}
	return errors.New(usage)
}

func printHosts(l *lab.Lab) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tPRIVATE\tPUBLIC\tSTATE\tMEMORY\tCPUS\tLONGHORN\tSSH")
	for _, h := range l.Hosts {
		state := "stopped"
		if h.Running() {
			state = "running"
		}
		size := func(v int) string {
			if v == 0 {
				return "-"
			}
			return strconv.Itoa(v)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\tssh -i %s -o UserKnownHostsFile=%s root@%s\n",
			h.Name, h.PrivateIP, h.PublicIP, state, size(h.MemoryMiB), size(h.CPUs), size(h.LonghornDiskGiB), h.KeyPath, l.KnownHostsPath, h.PublicIP)
	}
	w.Flush()
}
