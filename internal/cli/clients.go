package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/term"

	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
)

// Cluster returns the configured cluster chosen by --cluster or KIP_CLUSTER (or the default
// one), or nil when no cluster is configured and none was asked for.
func (f *Factory) Cluster() (*config.Cluster, error) {
	store, err := f.ConfigStore()
	if err != nil {
		return nil, err
	}
	cfg, err := store.Load()
	if err != nil {
		return nil, err
	}
	name := f.ClusterName()
	if name == "" && len(cfg.Clusters) == 0 {
		return nil, nil
	}
	return cfg.Cluster(name)
}

// Kube returns the cluster's API clients, built on the first call. The kubeconfig is
// --kubeconfig, else the chosen cluster's saved one, else KUBECONFIG or ~/.kube/config.
// Building the clients makes no request; the first API call does.
func (f *Factory) Kube() (*kube.Clients, error) {
	f.kubeOnce.Do(func() {
		path := f.Global.Kubeconfig
		saved := true
		if path == "" {
			cl, err := f.Cluster()
			if err != nil {
				f.kubeErr = err
				return
			}
			if cl != nil {
				path = cl.Kubeconfig
			}
			saved = cl != nil
		}
		cfg, err := kube.LoadConfig(path, f.Global.Context)
		if err != nil {
			if !saved {
				err = f.noClusterError(err)
			}
			f.kubeErr = err
			return
		}
		f.kube, f.kubeErr = kube.NewClients(cfg)
	})
	return f.kube, f.kubeErr
}

// noClusterError explains a kubeconfig that could not be loaded when no cluster is saved either:
// most likely no cluster was installed from this machine yet.
func (f *Factory) noClusterError(err error) error {
	file := config.FileName
	if dir, derr := config.Dir(); derr == nil {
		file = filepath.Join(dir, config.FileName)
	}
	const fix = "install one with 'kip install --host <server address>', or pass --kubeconfig"
	msg := err.Error()
	if looked, ok := strings.CutPrefix(msg, "no kubeconfig found: "); ok {
		looked, _, _ = strings.Cut(looked, "; ")
		return &NoClusterError{fmt.Sprintf("no cluster is saved in %s and no kubeconfig was found (%s): %s", file, looked, fix), err}
	}
	return &NoClusterError{fmt.Sprintf("no cluster is saved in %s, and %s: %s", file, msg, fix), err}
}

// NoClusterError is Kube's error when no cluster is saved and no kubeconfig could be loaded; it
// says how to install one, and wraps the kubeconfig's error.
type NoClusterError struct {
	msg string
	err error
}

func (e *NoClusterError) Error() string { return e.msg }
func (e *NoClusterError) Unwrap() error { return e.err }

// SSHConfig returns how to reach host: flags first, then what is saved for the cluster (saved
// may be nil), then ~/.ssh/config and kip's defaults, which sshx applies.
func (f *Factory) SSHConfig(host string, saved *config.Cluster) (sshx.Config, error) {
	dir, err := config.Dir()
	if err != nil {
		return sshx.Config{}, err
	}
	c := sshx.Config{
		Host:           host,
		KeyPath:        f.SSHKeyPath(saved),
		KnownHostsPath: filepath.Join(dir, "known_hosts"),
		Notify:         f.Printer().Warn,
	}
	switch {
	case f.Global.SSHUserSet:
		c.User = f.Global.SSHUser
	case saved != nil && saved.SSHUser != "":
		c.User = saved.SSHUser
	}
	if saved != nil && host == saved.Host {
		// The port saved is the server's: a worker is reached on its own (~/.ssh/config or 22).
		c.Port = saved.SSHPort
	}
	if f.IO.StdinTTY && f.IO.StderrTTY {
		c.Passphrase = f.readPassphrase
	}
	return c, nil
}

// SSH returns the one connection to the host c names, dialling it on first use.
func (f *Factory) SSH(ctx context.Context, c sshx.Config) (*sshx.Client, error) {
	f.Debugf("ssh: connecting to %s", c.Host)
	return f.ssh.Get(ctx, c)
}

// Close releases the connections the factory opened.
func (f *Factory) Close() error { return f.ssh.Close() }

// readPassphrase asks for a key's passphrase on the factory's own streams: without echo when
// its input is a terminal, else one line of it.
func (f *Factory) readPassphrase(prompt string) ([]byte, error) {
	fmt.Fprint(f.IO.ErrOut, prompt)
	defer fmt.Fprintln(f.IO.ErrOut)
	if in, ok := f.IO.In.(*os.File); ok && term.IsTerminal(int(in.Fd())) {
		return term.ReadPassword(int(in.Fd()))
	}
	line, err := bufio.NewReader(f.IO.In).ReadString('\n')
	if err != nil && (err != io.EOF || line == "") {
		return nil, fmt.Errorf("read the passphrase: %w", err)
	}
	return []byte(strings.TrimRight(line, "\r\n")), nil
}
