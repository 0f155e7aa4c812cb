// Command demo shows kip's main job on this machine: it brings up one lab host (a Debian server
// in a systemd-nspawn container, 4 GiB as kip sees it), runs the real kip install against it
// through the airgap path with the k3s stand-in as the "k3s release", then kip status and kip
// doctor. make demo runs it; KEEP=1 leaves the host up afterwards.
//
// It is a test tool: the k3s it installs is the stand-in (test/k3s-standin), which runs the real
// Kubernetes control plane but no containers.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/testenv"
)

const banner = `
kip demo — what is real and what is not
  real:      kip itself (bin/kip), SSH, the Debian host with systemd, apt, ufw, the Kubernetes
             control plane (kube-apiserver, etcd, controller-manager, scheduler v1.37.2) and the
             node: containerd, runc, the kubelet, kube-proxy, a pod network, CoreDNS and the
             local-path provisioner, so every pod runs as containers on the host
  stand-in:  "k3s" is test/k3s-standin, uploaded through kip's airgap path as if it were the k3s
             release: it runs those parts under k3s's systemd unit and paths, but it is not k3s's
             single binary and has no flannel; charts (HelmCharts) are "installed" by its
             helm-controller as Jobs that complete without running helm; the Kipper console is
             a stand-in image that only answers HTTP
  simulated: the host's 4 GiB of RAM (a /proc/meminfo fixture), kernel modules (a modprobe shim)
             and the kubelet's kernel tunables (fixture files)
`

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root: run make demo as root")
	}
	keep := os.Getenv("KEEP") == "1"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	bins, err := testenv.BinDir()
	if err != nil {
		return err
	}
	fmt.Print(banner)
	bundle, err := e2e.StandinBundle(filepath.Join(root, "bin", "k3s-standin"))
	if err != nil {
		return err
	}
	defer os.RemoveAll(bundle) //nolint:errcheck // a temporary directory
	binds, err := e2e.StandinBinds(bins)
	if err != nil {
		return err
	}
	fmt.Println("\n== Bringing up one lab host (4 GiB, 2 CPUs)")
	l, err := lab.Up(ctx, 1, lab.Options{
		// The lab's kernel loads no modules: the host pretends to load the ones k3s needs.
		Hosts:      []lab.HostOptions{{MemoryMiB: 4096, CPUs: 2, Modules: []string{"br_netfilter", "overlay"}}},
		ReadOnly:   binds,
		Persistent: keep,
		Logf:       func(format string, args ...any) { fmt.Printf("   "+format+"\n", args...) },
	})
	if err != nil {
		return err
	}
	if !keep {
		defer func() {
			fmt.Println("\n== Removing the lab host (KEEP=1 keeps it)")
			if err := l.Down(context.Background()); err != nil {
				fmt.Fprintln(os.Stderr, "demo: remove the lab:", err)
			}
		}()
	}
	h := l.Hosts[0]
	if err := e2e.UploadChartFixtures(ctx, h); err != nil {
		return err
	}
	// Each demo brings up a new host (with a new host key): start kip's state afresh too.
	home := filepath.Join(root, "bin", "demo-home")
	if err := os.RemoveAll(home); err != nil {
		return err
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	kip := func(args ...string) error {
		fmt.Printf("\n$ kip %s\n", join(args))
		cmd := exec.CommandContext(ctx, filepath.Join(root, "bin", "kip"), args...)
		cmd.Env = append(os.Environ(), "KIP_HOME="+home)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		return cmd.Run()
	}
	host := h.PublicIP.String()
	if err := kip("install", "--host", host, "--ssh-key", h.KeyPath, "--admin-email", "admin@example.com",
		"--airgap-bundle", bundle, "--yes"); err != nil {
		return fmt.Errorf("kip install: %w", err)
	}
	if err := kip("status"); err != nil {
		return fmt.Errorf("kip status: %w", err)
	}
	if err := kip("doctor"); err != nil {
		fmt.Println("(kip doctor reported a problem: see above)")
	}
	fmt.Printf("\nkip's own files for this demo are in %s (KIP_HOME).\n", home)
	if keep {
		fmt.Printf("The host stays up: KIP_HOME=%s bin/kip status; make lab-down removes it.\n", home)
	}
	fmt.Print(banner)
	return nil
}

func join(args []string) string {
	s := ""
	for i, a := range args {
		if i > 0 {
			s += " "
		}
		s += a
	}
	return s
}
