package upgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/node"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// apiServerTimeout bounds the wait for the API server after the repair's restart (spec 002: two
// minutes).
const apiServerTimeout = 2 * time.Minute

// dexTimeout bounds the request that asks Dex for its discovery document.
const dexTimeout = 10 * time.Second

// Where the cluster's Dex answers inside it: its chart's Service and HTTP port.
const (
	dexNamespace = "dex"
	dexService   = "dex"
	dexPort      = "5556"
)

// serverRepair is the upgrade's part on the server, over SSH, on every upgrade (spec 002,
// "Clusters installed before operator login existed"): the API server's arguments, its audit
// policy and the trust anchor it verifies operators' logins against (the authentication
// configuration naming the cluster's Dex), written as install writes them, k3s restarted once on
// them, and restored when it does not come back.
type serverRepair struct {
	change k3s.ConfigChange
	st     k3s.ConfigState
	// adds are the arguments this run adds to the file's kube-apiserver-arg block; login
	// reports that authentication-config is among them.
	adds  []string
	login bool
	// noLogin says why operator login is not configured, "" when it is or will be.
	noLogin string
	issuer  string
	// network reports the pod network's move from VXLAN to WireGuard in this change: this
	// upgrade's, or an interrupted one's that it resumes (upgradeIntent.Network).
	network bool
}

// readServer reaches the server over SSH and decides its repair. It refuses, writing nothing,
// a kube-apiserver-arg block that is the operator's own and lacks arguments kip installs: it
// prints the additions for the operator to make.
func (u *upgrader) readServer(ctx context.Context, intent *upgradeIntent) (*serverRepair, error) {
	host := u.o.Server
	if host == "" {
		host = u.rec.Server
	}
	n, err := cluster.ServerNode(ctx, u.cl.Kube)
	if err != nil {
		return nil, err
	}
	u.p.Info(fmt.Sprintf("Checking the server's k3s configuration over SSH (%s): the API server's arguments, its audit policy and the trust anchor of operators' logins", host))
	c, err := u.o.Dial(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("kip upgrade reaches the server over SSH on every upgrade, even with --skip-system (the API server's arguments and trust anchor live there): %w", err)
	}
	config, err := node.ServerConfig(ctx, c, n, host)
	if err != nil {
		return nil, err
	}
	r := &serverRepair{issuer: k3s.DexIssuer(u.rec.Server)}
	want := k3s.ServerConfig{AuthenticationConfigPath: k3s.AuthenticationConfigPath}.APIServerArgs()
	args, err := k3s.JudgeAPIServerArgs(config, want)
	if err != nil {
		return nil, fmt.Errorf("the server's %w: fix the file, then run kip upgrade again. Nothing was changed", err)
	}
	if args.Custom {
		return nil, customArgsError(args)
	}
	loginArg := "authentication-config=" + k3s.AuthenticationConfigPath
	r.adds = args.Missing
	if slices.Contains(r.adds, loginArg) {
		if r.noLogin = u.dexAnswers(ctx, r.issuer); r.noLogin != "" {
			r.adds = slices.DeleteFunc(slices.Clone(r.adds), func(a string) bool { return a == loginArg })
		}
		r.login = r.noLogin == ""
	}
	// The files' state before anything is decided: an interrupted change of the network goes on.
	all := []k3s.File{{Path: k3s.AuditPolicyPath}, {Path: k3s.AuthenticationConfigPath}, {Path: k3s.ConfigPath}}
	if r.st, err = (k3s.ConfigChange{C: c, Files: all}).Read(ctx); err != nil {
		return nil, err
	}
	body := config
	if r.network, err = u.moveNetwork(ctx, c, config, r.st, intent); err != nil {
		return nil, err
	}
	if r.network {
		if body, err = k3s.SetFlannelBackend(body, k3s.FlannelWireGuard); err != nil {
			return nil, err
		}
	}
	if len(r.adds) > 0 {
		if body, err = k3s.AddAPIServerArgs(body, r.adds); err != nil {
			return nil, err
		}
	}
	block := append(slices.Clone(args.Have), r.adds...)
	var files []k3s.File
	if slices.Contains(block, "audit-policy-file="+k3s.AuditPolicyPath) {
		files = append(files, k3s.File{Path: k3s.AuditPolicyPath, Data: k3s.AuditPolicy(), Mode: 0o600})
	}
	if slices.Contains(block, loginArg) {
		authn, err := k3s.AuthenticationConfig(u.rec.Server)
		if err != nil {
			return nil, err
		}
		files = append(files, k3s.File{Path: k3s.AuthenticationConfigPath, Data: authn, Mode: 0o600})
	}
	if string(body) != string(config) {
		files = append(files, k3s.File{Path: k3s.ConfigPath, Data: body, Mode: 0o600})
	}
	apiReady := func(ctx context.Context) error { return kube.WaitReady(ctx, u.cl, u.rec.Server, apiServerTimeout) }
	r.change = k3s.ConfigChange{C: c, Files: files, Unit: k3s.ServerUnit, Verb: "restart", Again: "kip upgrade", Warn: u.p.Warn, Wait: apiReady}
	if r.network {
		ready, _, err := workloads(ctx, u.cl)
		if err != nil {
			return nil, err
		}
		r.change.Wait = func(ctx context.Context) error {
			if err := apiReady(ctx); err != nil {
				return err
			}
			if err := waitNetwork(ctx, u.cl, n.Name, flannelWireGuard); err != nil {
				return err
			}
			return waitWorkloads(ctx, u.cl, ready)
		}
		r.change.WaitRestored = func(ctx context.Context) error {
			if err := apiReady(ctx); err != nil {
				return err
			}
			return waitNetwork(ctx, u.cl, n.Name, flannelVXLAN)
		}
	}
	if r.noLogin != "" {
		u.p.Warn("Operator login could not be configured: " + r.noLogin + ". The API server gets its audit arguments without it, and certificate access (the admin kubeconfig) keeps working; " +
			"run kip upgrade again once Dex answers to configure it")
	}
	return r, nil
}

// customArgsError prints the arguments an operator's own kube-apiserver-arg block lacks, and
// stops.
func customArgsError(args k3s.APIServerArgs) error {
	var b strings.Builder
	fmt.Fprintf(&b, "the kube-apiserver-arg block in %s on the server is not the one kip writes, and lacks arguments this kip installs, so kip leaves it to you. Nothing was changed.\n"+
		"Add these lines to the block (k3s reads them on its next restart):\n", k3s.ConfigPath)
	for _, a := range args.Missing {
		fmt.Fprintf(&b, "      - %s\n", a)
	}
	fmt.Fprintf(&b, "then run kip upgrade again, before restarting k3s yourself: it writes the files they name (%s, %s) and restarts k3s on them", k3s.AuditPolicyPath, k3s.AuthenticationConfigPath)
	return &cli.DecisionError{Err: fmt.Errorf("%s", b.String())}
}

// dexAnswers asks the cluster's Dex for its discovery document through the API server's proxy
// to its Service, and says why login cannot be configured ("" when Dex answers as issuer).
func (u *upgrader) dexAnswers(ctx context.Context, issuer string) string {
	ctx, cancel := context.WithTimeout(ctx, dexTimeout)
	defer cancel()
	body, err := u.cl.Kube.CoreV1().Services(dexNamespace).ProxyGet("http", dexService, dexPort, "/.well-known/openid-configuration", nil).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("Dex does not answer (%s/%s:%s: %v)", dexNamespace, dexService, dexPort, err)
	}
	var doc struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.Issuer != issuer {
		return fmt.Sprintf("Dex answers as issuer %q, not %s", doc.Issuer, issuer)
	}
	return ""
}

// step is the repair's step in the upgrade's workflow.
func (r *serverRepair) step(u *upgrader) workflow.Step {
	what := []string{}
	for _, f := range r.change.Files {
		if r.st.Sums[f.Path] != sshx.SHA256(f.Data) {
			what = append(what, f.Path)
		}
	}
	title, done := "Restart k3s on the configuration an earlier run wrote; workloads keep running through it", "k3s restarted on its configuration"
	switch {
	case r.network:
		title, done = "Move the pod network from VXLAN to WireGuard: k3s restarts once (workloads keep running through it), then up to five minutes each for the network and for the workloads that were ready", "The pod network runs on WireGuard"
		if len(r.adds) > 0 {
			title += "; the API server gets the arguments this kip installs in the same restart"
			done += ", and the API server has its arguments"
		}
	case len(r.adds) > 0:
		title, done = "The API server is missing the arguments this kip installs. Adding them and restarting k3s once; workloads keep running through it.", "API server arguments, and k3s restarted on them"
	case len(what) > 0:
		title, done = "The API server's audit policy or login configuration differs from this kip's ("+strings.Join(what, ", ")+"): writing it and restarting k3s once to load it; workloads keep running through it",
			"Audit policy and login configuration, and k3s restarted on them"
	}
	return workflow.Step{
		Name: "api-server", Title: title, Done: done,
		Already: "The API server has the arguments, audit policy and login configuration this kip installs",
		Check: func(ctx context.Context) (bool, error) {
			st, err := r.change.Read(ctx)
			if err != nil {
				return false, err
			}
			r.st = st
			if !r.change.Done(st) || !r.network {
				return r.change.Done(st), nil
			}
			rec, err := cluster.ReadInstalled(ctx, u.cl.Dynamic)
			return rec.Network == cluster.NetworkWireGuard, err
		},
		Apply: func(ctx context.Context) error {
			if r.network {
				if err := r.loadWireGuard(ctx, u.rec.Storage == cluster.StorageLonghorn); err != nil {
					return err
				}
			}
			if !r.change.Done(r.st) {
				if err := r.change.Write(ctx, r.st); err != nil {
					return err
				}
				st, err := r.change.Read(ctx)
				if err != nil {
					return err
				}
				if err := r.change.Restart(ctx, st); err != nil {
					return err
				}
			}
			if !r.network {
				return nil
			}
			// The pod network runs on WireGuard: the record says so, which kip node add reads.
			_, err := cluster.UpdateRecord(ctx, u.cl.Dynamic, func(rec *cluster.Record, _ bool) error { rec.Network = cluster.NetworkWireGuard; return nil })
			return err
		},
	}
}

// loadWireGuard loads the wireguard module before the pod network moves onto it, and has it
// load at every boot, as install does for a WireGuard cluster.
func (r *serverRepair) loadWireGuard(ctx context.Context, longhorn bool) error {
	c, mods := r.change.C, host.Modules(longhorn, true)
	if ok, err := host.ModulesInPlace(ctx, c, mods); ok || err != nil {
		return err
	}
	f, err := c.Facts(ctx)
	if err != nil {
		return err
	}
	return host.LoadModules(ctx, c, f.OS, mods)
}
