// Command k3s-standin stands in for the k3s binary in kip's test lab, where no k3s can be
// downloaded. Installed as /usr/local/bin/k3s through kip's airgap path, it runs under the same
// systemd units as k3s and answers like it: `k3s server` runs the real etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler as its children, writes k3s's kubeconfig, token and
// certificates where k3s writes them and keeps its own Node Ready, creates helm-controller's CRDs
// and the local-path StorageClass and turns HelmCharts into install Jobs as k3s's helm-controller
// does; `k3s agent` joins a Node with the token; kwok plays each Node's kubelet for Pods. Nothing
// runs containers and no helm runs. See docs/k3s-standin.md. It is never part of kip.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"kipper.run/kip/manifests"
)

// version is the k3s release the stand-in claims to be, set at build time with
// -ldflags "-X main.version=v1.36.3+k3s1"; empty means the k3s pinned in manifests/versions.yaml.
var version string

var versionPattern = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?\+k3s\d+$`)

func k3sVersion() (string, error) {
	v := version
	if v == "" {
		pins, err := manifests.Pinned()
		if err != nil {
			return "", err
		}
		c, err := pins.Component("k3s")
		if err != nil {
			return "", err
		}
		v = c.Version
	}
	if !versionPattern.MatchString(v) {
		return "", fmt.Errorf("version %q is not a k3s version like v1.37.2+k3s1", v)
	}
	return v, nil
}

// commit is the source revision, set at build time with -ldflags "-X main.commit=…" (the
// Makefile does); empty means the revision Go stamped, when it did.
var commit string

// revision is the source revision the stand-in was built from, as k3s prints its own.
func revision() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 8 {
				return s.Value[:8]
			}
		}
	}
	return "unknown"
}

const defaultKubeconfig = "/etc/rancher/k3s/k3s.yaml"

func main() { os.Exit(run(os.Args)) }

func run(argv []string) int {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if filepath.Base(argv[0]) == "kubectl" {
		return exitCode(runKubectl(argv[1:])) // k3s's install script links kubectl to k3s
	}
	if len(argv) < 2 {
		usage(os.Stderr)
		return 1
	}
	cmd, args := argv[1], argv[2:]
	switch cmd {
	case "--version", "-v":
		v, err := k3sVersion()
		if err != nil {
			return exitCode(err)
		}
		fmt.Printf("k3s version %s (%s)\ngo version %s\n", v, revision(), runtime.Version())
		return 0
	case "--help", "-h", "help":
		usage(os.Stdout)
		return 0
	case "kubectl":
		return exitCode(runKubectl(args))
	case "ctr":
		return exitCode(runCtr(args))
	case "server", "agent":
		if slices.Contains(args, "--help") || slices.Contains(args, "-h") {
			commandUsage(os.Stdout, cmd)
			return 0
		}
		v, err := k3sVersion()
		if err != nil {
			return exitCode(err)
		}
		o, err := parseOptions(cmd, args, os.Getenv)
		if err != nil {
			return exitCode(err)
		}
		o.useReleaseBinDir(v)
		for _, w := range o.warnings {
			slog.Warn(w)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		slog.Info("starting k3s stand-in "+cmd, "version", v, "commit", revision(), "binaries", o.str("standin-bin-dir"))
		if cmd == "server" {
			if err := injectedFault(ctx); err != nil {
				return exitCode(err)
			}
			return exitCode(runServer(ctx, o, v))
		}
		return exitCode(runAgent(ctx, o, v))
	default:
		fmt.Fprintf(os.Stderr, "the k3s stand-in does not implement %q (it has server, agent, kubectl and --version)\n", cmd)
		return 1
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	slog.Error(err.Error())
	return 1
}

// standinBinDir is the directory of the real binaries the stand-in runs: those of its release
// (releaseBinDir) in $KIP_STANDIN_BIN or standin-bin-dir's default.
func standinBinDir() string {
	d := os.Getenv("KIP_STANDIN_BIN")
	if d == "" {
		d = defsFor("server")["standin-bin-dir"].def
	}
	if v, err := k3sVersion(); err == nil {
		d, _ = releaseBinDir(d, v)
	}
	return d
}

// releaseBinDir returns the directory of the binaries of the Kubernetes release that version (a
// k3s release, v1.36.3+k3s1) is built on, as a k3s release runs its own: binDir's subdirectory
// named for that release (v1.36.3) when there is one (sh tools/testenv.sh older links an older
// release's build there), else binDir itself. warning is not empty when binDir's VERSION file
// names another release and no such subdirectory exists: the stand-in then runs that release.
func releaseBinDir(binDir, version string) (dir, warning string) {
	release, _, _ := strings.Cut(version, "+")
	sub := filepath.Join(binDir, release)
	if fi, err := os.Stat(sub); err == nil && fi.IsDir() {
		return sub, ""
	}
	if data, err := os.ReadFile(filepath.Join(binDir, "VERSION")); err == nil {
		if built := strings.TrimSpace(string(data)); built != "" && built != release {
			warning = fmt.Sprintf("the k3s stand-in claims %s, but %s holds Kubernetes %s and no %s/: it runs %s "+
				"(its Node and /version report that release; sh tools/testenv.sh older builds an older one)", version, binDir, built, release, built)
		}
	}
	return binDir, warning
}

// useReleaseBinDir points standin-bin-dir at the binaries of version's Kubernetes release
// (releaseBinDir).
func (o *options) useReleaseBinDir(version string) {
	dir, warning := releaseBinDir(o.str("standin-bin-dir"), version)
	o.values["standin-bin-dir"] = []string{dir}
	if warning != "" {
		o.warnings = append(o.warnings, warning)
	}
}

// runCtr is k3s ctr: containerd's own ctr, as k3s bundles it, on the containerd the stand-in
// runs (the address and namespace are the caller's flags).
func runCtr(args []string) error {
	path := filepath.Join(standinBinDir(), "ctr")
	if err := syscall.Exec(path, append([]string{"ctr"}, args...), os.Environ()); err != nil {
		return fmt.Errorf("run %s: %w", path, err)
	}
	return nil
}

// runKubectl replaces the process with the bundled kubectl, on k3s.yaml unless a kubeconfig is
// named, as `k3s kubectl` does.
func runKubectl(args []string) error {
	env := os.Environ()
	named := slices.ContainsFunc(args, func(a string) bool { return a == "--kubeconfig" || strings.HasPrefix(a, "--kubeconfig=") })
	if os.Getenv("KUBECONFIG") == "" && !named {
		env = append(env, "KUBECONFIG="+defaultKubeconfig)
	}
	path := filepath.Join(standinBinDir(), "kubectl")
	if err := syscall.Exec(path, append([]string{"kubectl"}, args...), env); err != nil {
		return fmt.Errorf("run %s: %w", path, err)
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprint(w, `k3s stand-in: kip's test lab's replacement for k3s (real control plane, kwok for kubelets, no containers)

Usage:
  k3s server [flags]     run etcd, kube-apiserver, kube-controller-manager, kube-scheduler and this Node
  k3s agent [flags]      join this Node to a server with its token
  k3s kubectl [args]     run the bundled kubectl on /etc/rancher/k3s/k3s.yaml
  k3s ctr [args]         run the bundled ctr
  k3s --version          print the version

"k3s server --help" and "k3s agent --help" list the flags. See docs/k3s-standin.md.
`)
}

func commandUsage(w io.Writer, cmd string) {
	fmt.Fprintf(w, "Usage: k3s %s [flags]\n\nFlags (also keys of the config file, and some K3S_* variables):\n", cmd)
	for _, d := range flagDefs {
		if (cmd == "server" && !d.server) || (cmd == "agent" && !d.agent) {
			continue
		}
		name := "--" + d.name
		if d.short != "" {
			name += ", -" + d.short
		}
		line := fmt.Sprintf("  %-30s %s", name, d.usage)
		if d.def != "" {
			line += fmt.Sprintf(" (default %q)", d.def)
		}
		if d.env != "" {
			line += " [$" + d.env + "]"
		}
		fmt.Fprintln(w, line)
	}
}
