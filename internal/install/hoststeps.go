package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// hostState is what is already on the host, from the probe (preflight.sh).
type hostState struct {
	k3sVersion string // the installed k3s release, "" when none
	serverData bool   // k3s has run as a server here: it has a cluster
	// unit is k3s's unit when kip looked. Its invocation ID ("" when k3s was not running) tells
	// whether k3s has restarted since: the host's own ID, so that no clock is compared with
	// another machine's.
	unit     unitState
	intent   *cluster.Intent // an unfinished install's intent, nil when none
	firewall host.FirewallState
}

// seen is what this run last read of k3s on the host: its release, its unit and the checksums of
// its binary, files and unit. It starts as the probe found them and is forgotten whenever a host
// step changes something, so that checks that follow one another read the host once, and a
// check after a change reads it again.
type seen struct {
	versionRead, unitRead bool // version and unit hold what the host has
	version               string
	unit                  unitState
	sums                  map[string]string // by path; nil until read
}

// forget drops what was seen: a step is about to change the host, or just did.
func (s *seen) forget() { *s = seen{} }

// installedVersion is the k3s release at k3s.BinaryPath ("" when none).
func (in *installer) installedVersion(ctx context.Context) (string, error) {
	if !in.seen.versionRead {
		v, err := k3s.RemoteVersion(ctx, in.c, k3s.BinaryPath)
		if err != nil {
			return "", err
		}
		in.seen.versionRead, in.seen.version = true, v
	}
	return in.seen.version, nil
}

// unitNow is what systemd says of k3s's unit.
func (in *installer) unitNow(ctx context.Context) (unitState, error) {
	if !in.seen.unitRead {
		u, err := in.k3sUnit(ctx)
		if err != nil {
			return unitState{}, err
		}
		in.seen.unitRead, in.seen.unit = true, u
	}
	return in.seen.unit, nil
}

// sumsNow returns the SHA-256 of each of k3s's paths (k3sPaths) that exists.
func (in *installer) sumsNow(ctx context.Context) (map[string]string, error) {
	if in.seen.sums == nil {
		sums, err := in.c.FileSums(ctx, in.k3sPaths...)
		if err != nil {
			return nil, err
		}
		in.seen.sums = sums
	}
	return in.seen.sums, nil
}

// unitState is what systemd says of k3s's unit.
type unitState struct {
	state           string // ActiveState: active, activating, failed, inactive…
	active, enabled bool
	invocation      string // systemd's InvocationID of the current run, "" when none
}

// restartedSince reports whether k3s runs in another systemd invocation than the one kip saw
// (before; "" when it was not running then). A re-run restarts k3s once so that it loads the
// configuration kip wrote; the invocation ID, not a timestamp, decides, so that neither clock
// skew between the operator's machine and the host nor a one-second timestamp can mislead it.
func restartedSince(before string, u unitState) bool {
	return u.active && u.invocation != "" && u.invocation != before
}

func (in *installer) k3sUnit(ctx context.Context) (unitState, error) {
	out, err := in.c.Output(ctx, "systemctl show k3s -p ActiveState -p UnitFileState -p InvocationID")
	if err != nil {
		return unitState{}, fmt.Errorf("systemctl show k3s: %w", err)
	}
	return parseUnit(string(out)), nil
}

// parseUnit reads systemctl show's ActiveState, UnitFileState and InvocationID.
func parseUnit(out string) unitState {
	p, _ := sshx.Properties(out)
	return unitState{state: p["ActiveState"], active: p["ActiveState"] == "active",
		enabled: p["UnitFileState"] == "enabled", invocation: p["InvocationID"]}
}

// run runs cmd on the host and fails, saying what it was doing, when it fails.
func (in *installer) run(ctx context.Context, what, cmd string) error {
	if _, err := in.c.Output(ctx, cmd); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// k3sFiles are the files of the k3s configuration step.
func (in *installer) k3sFiles() ([]k3s.File, error) {
	body, err := k3s.KipServer(in.address, in.nodeIP, in.externalIP, in.network).Render()
	if err != nil {
		return nil, err
	}
	authn, err := k3s.AuthenticationConfig(in.address)
	if err != nil {
		return nil, err
	}
	return []k3s.File{
		{Path: k3s.AuditPolicyPath, Data: k3s.AuditPolicy(), Mode: 0o600},
		{Path: k3s.AuthenticationConfigPath, Data: authn, Mode: 0o600},
		{Path: k3s.ConfigPath, Data: body, Mode: 0o600},
	}, nil
}

// hostSteps are the steps on the server's host, up to a running k3s and a saved kubeconfig.
func (in *installer) hostSteps() ([]workflow.Step, error) {
	prep := host.Prep{OS: in.facts.OS, Longhorn: in.sizing.Storage == cluster.StorageLonghorn,
		WireGuard: in.network == cluster.NetworkWireGuard, Sysctls: !in.state.serverData}
	if in.fw {
		prep.Firewall = in.firewallRules()
	}
	steps := append([]workflow.Step{in.intentStep()}, in.family.PrepSteps(in.c, prep)...)
	steps = append(steps, in.k3sSteps()...)
	for i := range steps {
		apply := steps[i].Apply
		steps[i].Apply = func(ctx context.Context) error {
			in.seen.forget()
			defer in.seen.forget()
			return apply(ctx)
		}
	}
	return steps, nil
}

// firewallRules are the server's firewall rules: its own, and the peer ports open to the
// recorded workers.
func (in *installer) firewallRules() []host.Rule {
	return host.ServerFirewall(in.sshPort(), in.nodes.WorkerAddresses(""))
}

// sshPort is the port kip reached the host on, which the firewall keeps open.
func (in *installer) sshPort() int {
	if p := in.c.Port(); p != 0 {
		return p
	}
	return 22
}

// k3sSteps install k3s's binary, configuration and unit, start it and save the kubeconfig.
func (in *installer) k3sSteps() []workflow.Step {
	files, filesErr := in.k3sFiles()
	unitName, unitFile, unitErr := k3s.Unit("server")
	in.k3sPaths = []string{k3s.BinaryPath, k3s.UnitPath(unitName)}
	for _, f := range files {
		in.k3sPaths = append(in.k3sPaths, f.Path)
	}
	change := k3s.ConfigChange{C: in.c, Files: files, Unit: unitName, Verb: "start", Again: "the same kip install", Warn: in.p.Warn,
		Wait: func(ctx context.Context) error {
			clients, err := in.connectAPI(ctx, k3sReadyTimeout)
			in.clients = clients
			return err
		}}
	if in.state.serverData {
		change.Verb = "restart"
	}
	return []workflow.Step{
		{
			Name: "k3s-binary", Title: "Install k3s " + in.move.To,
			Done: "Installed k3s " + in.move.To, Already: "k3s " + in.move.To + " already installed",
			Check: func(ctx context.Context) (bool, error) {
				v, err := in.installedVersion(ctx)
				if err != nil || v != in.move.To {
					return false, err
				}
				if in.bundle == nil {
					return true, nil
				}
				sums, err := in.sumsNow(ctx)
				return sums[k3s.BinaryPath] == in.bundle.SHA256, err
			},
			Plan:  func(context.Context) ([]string, error) { return []string{in.binary.Plan(in.o.AirgapBundle)}, nil },
			Apply: func(ctx context.Context) error { return in.binary.Install(ctx) },
		},
		{
			Name: "k3s-config", Title: "Write k3s's configuration",
			Done: "Wrote k3s's configuration (the previous files kept as *" + k3s.BackupSuffix + ")", Already: "k3s's configuration already as kip writes it",
			Check: func(ctx context.Context) (bool, error) {
				if filesErr != nil {
					return false, filesErr
				}
				return in.filesInPlace(ctx, files)
			},
			Plan: func(context.Context) ([]string, error) {
				var s []string
				for _, f := range files {
					s = append(s, "write "+f.Path)
				}
				return s, filesErr
			},
			Apply: func(ctx context.Context) error {
				st, err := change.Read(ctx)
				if err != nil {
					return err
				}
				return change.Write(ctx, st)
			},
		},
		{
			Name: "k3s-unit", Title: "Install the k3s service",
			Done: "Installed the k3s service", Already: "k3s service already installed",
			Check: func(ctx context.Context) (bool, error) {
				if unitErr != nil {
					return false, unitErr
				}
				ok, err := in.filesInPlace(ctx, []k3s.File{{Path: k3s.UnitPath(unitName), Data: unitFile, Mode: 0o644}})
				if !ok || err != nil {
					return false, err
				}
				u, err := in.unitNow(ctx)
				return u.enabled, err
			},
			Apply: func(ctx context.Context) error {
				if err := in.c.Upload(ctx, k3s.UnitPath(unitName), unitFile, 0o644, ""); err != nil {
					return err
				}
				return in.run(ctx, "enable k3s", "systemctl daemon-reload && "+sshx.Command("systemctl", "enable", unitName))
			},
		},
		{
			Name: "k3s-start", Title: in.startTitle(),
			Done: "k3s runs and its API answers", Already: "k3s already runs on kip's configuration",
			Check: func(ctx context.Context) (bool, error) {
				u, err := in.unitNow(ctx)
				if err != nil || !u.active {
					return false, err
				}
				return !in.state.serverData || restartedSince(in.state.unit.invocation, u), nil
			},
			Apply: func(ctx context.Context) error {
				st, err := change.Read(ctx)
				if err != nil {
					return err
				}
				return change.Restart(ctx, st)
			},
		},
		{
			Name: "kubeconfig", Title: "Save the kubeconfig",
			Done: "Saved the kubeconfig at " + in.kubePath, Already: "Kubeconfig already saved at " + in.kubePath,
			Check: func(ctx context.Context) (bool, error) {
				want, err := in.kubeconfig(ctx)
				if errors.Is(err, k3s.ErrNoKubeconfig) {
					return false, nil // k3s has not written it yet
				}
				if err != nil {
					return false, err
				}
				have, err := os.ReadFile(in.kubePath)
				return err == nil && bytes.Equal(have, want), nil
			},
			Apply: func(ctx context.Context) error {
				data, err := in.kubeconfig(ctx)
				if err != nil {
					return err
				}
				return config.WriteFileAtomic(in.kubePath, data, 0o600)
			},
		},
	}
}

func (in *installer) startTitle() string {
	if in.state.serverData {
		return "Restart k3s on kip's configuration"
	}
	return "Start k3s"
}

// filesInPlace reports whether each file is on the host with the content kip would write.
func (in *installer) filesInPlace(ctx context.Context, files []k3s.File) (bool, error) {
	sums, err := in.sumsNow(ctx) // files are among k3sPaths

	if err != nil {
		return false, err
	}
	for _, f := range files {
		if sums[f.Path] != sshx.SHA256(f.Data) {
			return false, nil
		}
	}
	return true, nil
}

// k3sReadyTimeout bounds the wait for k3s's API after a start or restart.
const k3sReadyTimeout = 5 * time.Minute

// kubeconfig is k3s's admin kubeconfig as kip saves it for this cluster.
func (in *installer) kubeconfig(ctx context.Context) ([]byte, error) {
	return k3s.AdminKubeconfig(ctx, in.c, in.name, in.address)
}

// connectAPI builds API clients from the server's kubeconfig and waits until the API answers
// /readyz, for at most timeout.
func (in *installer) connectAPI(ctx context.Context, timeout time.Duration) (*kube.Clients, error) {
	deadline := time.Now().Add(timeout)
	data, err := in.kubeconfig(ctx)
	for errors.Is(err, k3s.ErrNoKubeconfig) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		data, err = in.kubeconfig(ctx)
	}
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return nil, err
	}
	clients, err := kube.NewClients(rc)
	if err != nil {
		return nil, err
	}
	return clients, kube.WaitReady(ctx, clients, rc.Host, max(time.Until(deadline), time.Second))
}
