package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The lab's networks. Host i (from 1) has PrivatePrefix .10+i on eth0 and PublicPrefix .10+i on
// eth1; the bridges hold .1.
const (
	PrivatePrefix = "10.77.0.0/24"
	PublicPrefix  = "198.51.100.0/24"
	// Gateway is this machine on the public bridge: the hosts' default route and apt proxy.
	Gateway = "198.51.100.1"
	// AptProxy is the apt-cacher-ng every host uses.
	AptProxy = "http://" + Gateway + ":3142"

	// PrivateGateway is this machine on the private bridge: a host's default route through it
	// makes the private network carry the default route, as a cloud VPC's does.
	PrivateGateway = "10.77.0.1"

	privateBridge = "kip-priv"
	publicBridge  = "kip-pub"
	aptPort       = "3142"
	fwChain       = "KIP-LAB"
	// guardMetric puts the unreachable routes behind the bridges' own routes (metric 0).
	guardMetric = "4000"
)

// guardedPrefixes route to the lab's bridges or nowhere while the lab is up, and nowhere after:
// the lab's ranges and k3s's default pod and service ranges.
var guardedPrefixes = []string{PrivatePrefix, PublicPrefix, "10.42.0.0/16", "10.43.0.0/16"}

// addRoutes adds an unreachable route for each guarded prefix to the root namespace.
func addRoutes(ctx context.Context) error {
	for _, p := range guardedPrefixes {
		if err := run(ctx, "ip", "route", "replace", "unreachable", p, "metric", guardMetric); err != nil {
			return err
		}
	}
	return nil
}

// deleteRoutes removes the unreachable routes.
func deleteRoutes(ctx context.Context) error {
	for _, p := range guardedPrefixes {
		if err := run(ctx, "ip", "route", "del", "unreachable", p, "metric", guardMetric); err != nil && !strings.Contains(err.Error(), "No such process") {
			return err
		}
	}
	return nil
}

// netUp creates the bridges and the forwarding guard and starts apt-cacher-ng. The unreachable
// routes must exist already.
func netUp(ctx context.Context) error {
	if err := fwUp(ctx); err != nil {
		return err
	}
	for _, br := range []struct{ name, addr string }{
		{privateBridge, PrivateGateway + "/24"},
		{publicBridge, Gateway + "/24"},
	} {
		if err := run(ctx, "ip", "link", "add", br.name, "type", "bridge"); err != nil {
			return err
		}
		if err := run(ctx, "ip", "addr", "add", br.addr, "dev", br.name); err != nil {
			return err
		}
		if err := run(ctx, "ip", "link", "set", br.name, "up"); err != nil {
			return err
		}
	}
	return startAptCache(ctx)
}

// netDown stops apt-cacher-ng and removes the bridges and the forwarding guard; it leaves the
// unreachable routes. Parts already gone are skipped.
func netDown(ctx context.Context) error {
	errs := []error{stopAptCache()}
	for _, br := range []string{privateBridge, publicBridge} {
		errs = append(errs, deleteLink(ctx, br))
	}
	errs = append(errs, fwDown(ctx))
	return errors.Join(errs...)
}

// deleteLink deletes a network interface of the root namespace if it exists.
func deleteLink(ctx context.Context, name string) error {
	if _, err := net.InterfaceByName(name); err != nil {
		return nil
	}
	// Deleting a network namespace deletes its veth pairs a moment later.
	// iproute2 words a link that vanished meanwhile "Cannot find device" or "No such device".
	if err := run(ctx, "ip", "link", "del", name); err != nil && !strings.Contains(err.Error(), "Cannot find device") && !strings.Contains(err.Error(), "No such device") {
		return err
	}
	return nil
}

// The forwarding guard: the root namespace drops whatever it would forward into or out of the
// lab's bridges (traffic between two ports of one bridge passes: the hosts talk to each other),
// and what hosts send to its addresses other than the bridges' own.
var fwChains = []struct {
	name, parent string
	rules        [][]string
}{
	{fwChain, "FORWARD", [][]string{
		{"-i", privateBridge, "!", "-o", privateBridge, "-j", "DROP"},
		{"-o", privateBridge, "!", "-i", privateBridge, "-j", "DROP"},
		{"-i", publicBridge, "!", "-o", publicBridge, "-j", "DROP"},
		{"-o", publicBridge, "!", "-i", publicBridge, "-j", "DROP"},
	}},
	{fwChain + "-IN", "INPUT", [][]string{
		{"-i", privateBridge, "!", "-d", PrivateGateway, "-j", "DROP"},
		{"-i", publicBridge, "!", "-d", Gateway, "-j", "DROP"},
	}},
}

// fwUp installs the forwarding guard, replacing one left behind.
func fwUp(ctx context.Context) error {
	for _, c := range fwChains {
		if err := run(ctx, "iptables", "-w", "-N", c.name); err != nil && !strings.Contains(err.Error(), "exists") {
			return err
		}
		if err := run(ctx, "iptables", "-w", "-F", c.name); err != nil {
			return err
		}
		for _, r := range c.rules {
			if err := run(ctx, "iptables", append([]string{"-w", "-A", c.name}, r...)...); err != nil {
				return err
			}
		}
		if run(ctx, "iptables", "-w", "-C", c.parent, "-j", c.name) != nil {
			if err := run(ctx, "iptables", "-w", "-I", c.parent, "1", "-j", c.name); err != nil {
				return err
			}
		}
	}
	return nil
}

// fwDown removes the forwarding guard.
func fwDown(ctx context.Context) error {
	for _, c := range fwChains {
		if run(ctx, "iptables", "-w", "-n", "-L", c.name) != nil {
			continue // no chain
		}
		for run(ctx, "iptables", "-w", "-C", c.parent, "-j", c.name) == nil {
			if err := run(ctx, "iptables", "-w", "-D", c.parent, "-j", c.name); err != nil {
				return err
			}
		}
		if err := run(ctx, "iptables", "-w", "-F", c.name); err != nil {
			return err
		}
		if err := run(ctx, "iptables", "-w", "-X", c.name); err != nil {
			return err
		}
	}
	return nil
}

// apt-cacher-ng's files: its configuration and logs in the state directory, its cache in the
// cache directory, kept between labs.
var (
	aptConfDir = filepath.Join(stateDir, "apt-cacher-ng")
	aptPidFile = filepath.Join(stateDir, "apt-cacher-ng.pid")
	aptLog     = filepath.Join(stateDir, "apt-cacher-ng.log")
)

// startAptCache starts apt-cacher-ng on Gateway with a minimal configuration of its own: no
// Remap lines, so it serves any Debian mirror the hosts name as a plain caching proxy.
func startAptCache(ctx context.Context) error {
	cache := filepath.Join(cacheDir(), "apt-cacher-ng")
	logDir := filepath.Join(aptConfDir, "log")
	for _, d := range []string{cache, logDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	conf := strings.Join([]string{
		"CacheDir: " + cache,
		"LogDir: " + logDir,
		"SupportDir: /usr/lib/apt-cacher-ng",
		"BindAddress: " + Gateway,
		"Port: " + aptPort,
		"SocketPath: " + filepath.Join(aptConfDir, "socket"),
		"PidFile: " + aptPidFile,
		"ExThreshold: 4",
		"",
	}, "\n")
	if err := os.WriteFile(filepath.Join(aptConfDir, "acng.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	pid, err := startDetached("apt-cacher-ng", []string{"-c", aptConfDir, "ForeGround=1"}, nil, aptLog, aptPidFile, aptConfDir)
	if err != nil {
		return fmt.Errorf("start apt-cacher-ng: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(Gateway, aptPort), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if !alive(pid) || time.Now().After(deadline) {
			log, _ := os.ReadFile(aptLog)
			return fmt.Errorf("apt-cacher-ng does not listen on %s:%s: %s", Gateway, aptPort, strings.TrimSpace(string(log)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopAptCache stops the lab's apt-cacher-ng if it runs.
func stopAptCache() error {
	pid := readPid(aptPidFile, aptConfDir)
	if pid == 0 {
		return nil
	}
	syscall.Kill(pid, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if waitGone(ctx, pid) == nil {
		return nil
	}
	return killWait(pid)
}
