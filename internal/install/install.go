package install

import (
	"context"
	"errors"
	"fmt"
	"net/mail"
	"path/filepath"
	"strings"
	"time"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/node"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/manifests"
)

// Options is what kip install was asked to do.
type Options struct {
	Host       string // --host
	AdminEmail string // --admin-email
	Profile    string // --profile; "" picks by the server's size
	Storage    string // --storage; "" picks by the profile
	// Backups is external backup storage (--backup-storage-bucket and its flags); nil for none.
	Backups *components.BackupStorage
	// AirgapBundle is a directory with the k3s release's binary and checksum file; "" downloads
	// them on the host.
	AirgapBundle string
	SSHPort      int  // --ssh-port; 0 for the saved port, ~/.ssh/config or 22
	SSHPortSet   bool // --ssh-port was given (so 0 is a mistake, not "unset")
	Firewall     bool // --firewall: kip manages the host firewall unless an operator runs one
	DryRun       bool // --dry-run
}

// Validate checks the options before anything connects anywhere.
func (o *Options) Validate() error {
	if o.Host == "" {
		return cli.Usagef("--host is required: the server's address, e.g. kip install --host 203.0.113.10")
	}
	if err := cli.CheckHost("--host", o.Host); err != nil {
		return err
	}
	if o.AdminEmail != "" {
		if a, err := mail.ParseAddress(o.AdminEmail); err != nil || a.Address != o.AdminEmail {
			return cli.Usagef("--admin-email %q is not an email address", o.AdminEmail)
		}
	}
	if o.Profile != "" {
		if _, err := cluster.ProfileNamed(o.Profile); err != nil {
			return &cli.UsageError{Err: fmt.Errorf("--profile: %w", err)}
		}
	}
	switch o.Storage {
	case "", cluster.StorageLocal, cluster.StorageLonghorn:
	default:
		return cli.Usagef("--storage %q: choose local or longhorn", o.Storage)
	}
	if o.SSHPort < 0 || o.SSHPort > 65535 || o.SSHPortSet && o.SSHPort == 0 {
		return cli.Usagef("--ssh-port %d: give a port from 1 to 65535", o.SSHPort)
	}
	if o.Backups != nil {
		if err := o.Backups.Validate(); err != nil {
			return &cli.UsageError{Err: err}
		}
	}
	if o.AirgapBundle != "" {
		if err := k3s.CheckBundleDir(o.AirgapBundle); err != nil {
			return &cli.UsageError{Err: err}
		}
	}
	return nil
}

// Env is what kip install takes from the command around it; cmd/kip fills it from the
// factory, tests from what they build.
type Env struct {
	Printer  *cli.Printer
	Prompter *cli.Prompter
	// Store is ~/.kip (or KIP_HOME), where the cluster is saved.
	Store config.Store
	// Cluster is --cluster (or KIP_CLUSTER), "" for the host's own name.
	Cluster string
	// SSHUser (with SSHUserSet) and SSHKey are --ssh-user and --ssh-key, saved with the cluster.
	SSHUser    string
	SSHUserSet bool
	SSHKey     string
	// SSHConfig says how to reach a host; Dial connects (one connection per host).
	SSHConfig func(host string, saved *config.Cluster) (sshx.Config, error)
	Dial      func(ctx context.Context, c sshx.Config) (*sshx.Client, error)
	// CommandLine is the whole command, which the lock and the intent name.
	CommandLine string
	// Debugf prints -v lines.
	Debugf func(format string, args ...any)
}

// installer is one run of kip install.
type installer struct {
	env     Env
	p       *cli.Printer
	o       Options
	pinned  *manifests.Versions
	started time.Time

	name     string          // the cluster's name in ~/.kip/config.yaml
	saved    *config.Cluster // what config.yaml holds for it, nil when nothing yet
	kubePath string          // where its kubeconfig is saved

	c       *sshx.Client
	address string // the server's address for the cluster: --host after ~/.ssh/config's HostName
	facts   *sshx.Facts
	family  host.Family
	state   *hostState

	// Decisions, made before anything changes.
	rerun   bool // the cluster exists and has kip's record
	resumed bool // the server holds an unfinished install's intent, which this run continues
	// adminEmail and backups are this run's first admin and external backup storage: the flags,
	// else what the cluster record or the unfinished install's intent says.
	adminEmail string
	backups    *components.BackupStorage
	// intentWritten says this run wrote its intent on the server (intentStep).
	intentWritten bool
	// seen is what the host steps' checks last read of k3s; k3sPaths are the paths whose
	// checksums they compare.
	seen     seen
	k3sPaths []string
	record   cluster.Record // the existing record, on a re-run
	sizing   cluster.Sizing
	network  string
	move     k3s.Move
	bundle   *k3s.Binary // the k3s binary from --airgap-bundle, verified
	binary   k3s.BinaryInstall
	nodeIP   string
	// externalIP is the server's public address when its node IP is on the nodes' private
	// network, else "".
	externalIP string
	// nodes is what kip recorded of the cluster's workers (empty on a fresh install).
	nodes cluster.Nodes
	// workers is what happens to the recorded workers once the server runs its release.
	workers node.WorkerPlan
	fw      bool // kip manages the host firewall

	clients *kube.Clients // the cluster, once its API answers
	lock    *kube.Lock    // the cluster lock a re-run holds from its first host step
}

// Run installs Kipper on o.Host, or continues or re-runs an install there.
func Run(ctx context.Context, env Env, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if !o.DryRun {
		// Refuse before connecting when the confirmation could not be answered.
		if err := env.Prompter.CanConfirm(); err != nil {
			return err
		}
	}
	pinned, err := manifests.Pinned()
	if err != nil {
		return err
	}
	in := &installer{env: env, p: env.Printer, o: o, pinned: pinned, started: time.Now()}
	if err := in.resolveCluster(); err != nil {
		return err
	}
	if err := in.examine(ctx); err != nil {
		return err
	}
	if err := in.decide(ctx); err != nil {
		return err
	}
	if o.DryRun {
		return in.plan(ctx)
	}
	if err := in.confirm(); err != nil {
		return err
	}
	if err := in.saveCluster(); err != nil {
		return err
	}
	if in.clients != nil {
		// A re-run changes a running cluster from its first host step (configuration, firewall,
		// k3s's binary and restart): the cluster lock covers all of it.
		lock, err := kube.AcquireLock(ctx, in.clients.Kube, kube.HolderText(in.env.CommandLine), kube.LockOptions{LeaseDuration: kube.RestartLeaseDuration})
		if err != nil {
			return err
		}
		defer func() {
			if err := lock.Release(ctx); err != nil {
				in.p.Warn(fmt.Sprintf("%v (the lock frees itself %s after its last renewal)", err, kube.RestartLeaseDuration))
			}
		}()
		if lock.TookOverFrom != "" {
			in.p.Warn(fmt.Sprintf("Took over the cluster lock from %s: %s", lock.TookOverFrom, lock.TookOverBecause))
		}
		in.lock = lock
	}
	if err := in.runHost(ctx); err != nil {
		return err
	}
	if err := in.runCluster(ctx); err != nil {
		return err
	}
	if err := in.runWorkers(ctx); err != nil {
		return err
	}
	in.summary()
	env.Debugf("%d remote commands over one SSH connection to %s, %s in all", in.c.Commands(), o.Host, time.Since(in.started).Round(time.Second))
	return nil
}

// resolveCluster finds the cluster's name and what is saved for it: --cluster (or KIP_CLUSTER),
// else a saved cluster with this host, else the host itself names a new one.
func (in *installer) resolveCluster() error {
	store := in.env.Store
	cfg, err := store.Load()
	if err != nil {
		return err
	}
	in.name = in.env.Cluster
	for i := range cfg.Clusters {
		c := &cfg.Clusters[i]
		if (in.name != "" && c.Name == in.name) || (in.name == "" && c.Host == in.o.Host) {
			in.saved = c
			break
		}
	}
	if in.saved != nil && in.saved.Host != in.o.Host {
		return cli.Usagef("cluster %s is saved with host %s, not %s: pass --cluster with another name for a new cluster", in.saved.Name, in.saved.Host, in.o.Host)
	}
	if in.name == "" {
		in.name = in.o.Host
		if in.saved != nil {
			in.name = in.saved.Name
		}
	}
	if in.saved != nil && in.saved.Kubeconfig != "" {
		in.kubePath = in.saved.Kubeconfig
	} else {
		in.kubePath = filepath.Join(store.Dir, "kubeconfigs", safeFileName(in.name)+".yaml")
	}
	return nil
}

// safeFileName turns a cluster name into a file name.
func safeFileName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
			return r
		}
		return '_'
	}, name)
}

// examine connects, gathers the host's facts and runs the preflight checks.
func (in *installer) examine(ctx context.Context) error {
	cfg, err := in.env.SSHConfig(in.o.Host, in.saved)
	if err != nil {
		return err
	}
	if in.o.SSHPort != 0 {
		cfg.Port = in.o.SSHPort
	}
	in.p.Info(fmt.Sprintf("Connecting to %s", in.o.Host))
	if in.c, err = in.env.Dial(ctx, cfg); err != nil {
		return err
	}
	// The cluster's address (API URL, TLS name, the console's and Dex's domain) is the host as
	// SSH reaches it, after ~/.ssh/config's HostName: an alias means nothing to anyone else.
	in.address = in.c.Host()
	if in.facts, err = in.c.Facts(ctx, DiskPaths...); err != nil {
		return err
	}
	probe, err := probeHost(ctx, in.c)
	if err != nil {
		return err
	}
	in.state = &probe.state
	in.seen = seen{versionRead: true, version: probe.state.k3sVersion, unitRead: true, unit: probe.state.unit}
	// On a host whose k3s has a cluster, the cluster's record decides the profile and storage:
	// preflight checks what they need.
	if err := in.readExisting(ctx); err != nil {
		return err
	}
	if err := in.settle(); err != nil {
		return err
	}
	want := Request{Profile: in.o.Profile, Storage: in.o.Storage}
	if in.rerun || in.resumed {
		want.Recorded = &in.sizing
	}
	rep := evaluate(in.c.Host(), in.facts, probe, want)
	in.printPreflight(rep)
	if err := rep.Err(); err != nil {
		return err
	}
	if !in.rerun && !in.resumed {
		in.sizing = rep.Sizing
	}
	in.family, err = host.Identify(in.facts.OS)
	return err
}

func (in *installer) printPreflight(rep *Report) {
	ok := 0
	for _, c := range rep.Checks {
		switch c.Status {
		case StatusOK:
			ok++
			in.env.Debugf("preflight %s: %s", c.Name, c.Detail)
		case StatusWarn:
			in.p.Warn(withFix(c.Name+": "+c.Detail, c.Fix))
		case StatusFail:
			in.p.Fail(withFix(c.Name+": "+c.Detail, c.Fix))
		}
	}
	in.p.Success(fmt.Sprintf("Preflight on %s: %d of %d checks passed", rep.Host, ok, len(rep.Checks)))
}

func withFix(msg, fix string) string {
	if fix == "" {
		return msg
	}
	return msg + " (" + fix + ")"
}

// decide settles, before anything changes, what this run does: fresh install or re-run, the
// sizing, the pod network, the k3s move and the node address.
func (in *installer) decide(ctx context.Context) error {
	if !in.rerun && !in.resumed {
		in.network = cluster.NetworkVXLAN
		if in.facts.Modules["wireguard"].Usable() {
			in.network = cluster.NetworkWireGuard
		}
	}
	k3sPin, err := in.pinned.Component("k3s")
	if err != nil {
		return err
	}
	if in.move, err = k3s.PlanMove(in.state.k3sVersion, k3sPin.Version); err != nil {
		return err
	}
	if in.nodeIP, err = in.facts.NodeIP(in.address); err != nil {
		return err
	}
	if in.clients != nil {
		if in.nodes, err = cluster.ReadNodes(ctx, in.clients.Dynamic); err != nil {
			return err
		}
		if in.nodes.Mode == cluster.ModePrivate && in.nodes.Server.IsValid() && in.nodes.Server.String() != in.nodeIP {
			// The nodes reach the server over their private network: kip node add moved k3s there.
			in.nodeIP, in.externalIP = in.nodes.Server.String(), in.nodeIP
		}
		if err := in.planWorkers(ctx); err != nil {
			return err
		}
	}
	if _, err := components.ConsoleURL(in.address); err != nil {
		// The console and Dex answer at console.<ipv4>.sslip.io or console.<name>: refused here,
		// before anything changes, rather than when the components are rendered.
		return fmt.Errorf("%w: give kip install the server's IPv4 address or a DNS name that points at it", err)
	}
	if in.o.AirgapBundle != "" {
		// A damaged or wrong bundle is refused before anything changes.
		if in.bundle, err = k3s.LoadBundle(in.o.AirgapBundle, in.facts.Arch); err != nil {
			return err
		}
	}
	in.binary = k3s.BinaryInstall{C: in.c, Version: in.move.To, Arch: in.facts.Arch, Bundle: in.bundle}
	if k3sPin.SHA256 != "" && k3sPin.Version == in.move.To {
		in.binary.Pinned = k3sPin.SHA256
	}
	if in.bundle != nil {
		if err := in.binary.CheckPinned(in.bundle.SHA256); err != nil {
			return err
		}
	}
	in.fw = in.o.Firewall
	if in.fw && in.state.firewall.Active && !in.state.firewall.Managed {
		in.fw = false
		in.p.Warn(fmt.Sprintf("%s is active on %s and not managed by kip: kip leaves it alone; it must keep letting in %s",
			in.state.firewall.Tool, in.o.Host, host.Describe(in.firewallRules())))
	}

	in.p.Info(fmt.Sprintf("Profile: %s (%s)", in.sizing.Profile.Name, in.sizing.ProfileReason))
	in.p.Info(fmt.Sprintf("Storage: %s (%s)", in.sizing.Storage, in.sizing.StorageReason))
	in.p.Info("Pod network: " + networkWords(in.network, in.rerun))
	switch in.move.Kind {
	case k3s.Install:
		in.p.Info("k3s: install " + in.move.To)
	case k3s.Keep:
		in.p.Info("k3s: " + in.move.To + ", as pinned")
	case k3s.Upgrade:
		in.p.Info(fmt.Sprintf("k3s: upgrade %s to %s", in.move.From, in.move.To))
	case k3s.KeepBehind:
		in.p.Warn(in.move.Warning)
	}
	in.sayWorkers()
	return nil
}

func networkWords(n string, recorded bool) string {
	switch {
	case n == cluster.NetworkWireGuard:
		return "WireGuard (flannel wireguard-native)"
	case recorded:
		return "VXLAN, as recorded on the cluster (kip install keeps a cluster's pod network)"
	}
	return "VXLAN (the wireguard module cannot load here; kip node add will need it)"
}

// readExisting reads the cluster's record when k3s already runs on the host: a re-run keeps
// what the record says. A k3s that has run but whose API does not answer is refused, because
// kip could not tell what the cluster is.
func (in *installer) readExisting(ctx context.Context) error {
	if !in.state.serverData {
		return nil
	}
	// A k3s that is starting (an install stopped while it started it) gets the time a start
	// takes; one that is not running gets a short look.
	timeout := 20 * time.Second
	if u := in.state.unit; u.state == "active" || u.state == "activating" {
		timeout = k3sReadyTimeout
	}
	clients, err := in.connectAPI(ctx, timeout)
	if err != nil {
		return fmt.Errorf("k3s is installed on %s but its API does not answer, so kip cannot tell what the cluster is (%w): start it with 'systemctl start k3s' on the server, check 'journalctl -u k3s', then run kip install again", in.o.Host, err)
	}
	rec, found, err := cluster.ReadRecord(ctx, clients.Dynamic)
	if err != nil {
		return err
	}
	in.clients = clients
	if found {
		in.rerun, in.record = true, rec
		in.p.Info(fmt.Sprintf("%s already runs a Kipper cluster (installed by kip %s): re-running install", in.o.Host, rec.KipVersion))
	}
	return nil
}

// keepRecorded applies the re-run rules: the storage mode and the profile stay as recorded.
func (in *installer) keepRecorded() error {
	rec := in.record
	switch {
	case in.o.Storage != "" && in.o.Storage != rec.Storage && rec.Storage == cluster.StorageLocal:
		return fmt.Errorf("this cluster uses local storage and kip install never switches the storage mode of an existing cluster: switch it with 'kip cluster storage longhorn', or omit --storage")
	case in.o.Storage != "" && in.o.Storage != rec.Storage:
		return fmt.Errorf("this cluster uses Longhorn, and a Longhorn cluster stays on Longhorn: omit --storage")
	case in.o.Profile != "" && in.o.Profile != rec.Profile:
		return fmt.Errorf("this cluster uses the %s profile and kip install keeps it: change it with 'kip platform profile set %s', or omit --profile", rec.Profile, in.o.Profile)
	case in.o.AdminEmail != "" && rec.AdminEmail != "" && in.o.AdminEmail != rec.AdminEmail:
		return fmt.Errorf("this cluster's first admin is %s and kip install sets the first admin once: add %s in the console, or omit --admin-email", rec.AdminEmail, in.o.AdminEmail)
	}
	p, err := cluster.ProfileNamed(rec.Profile)
	if err != nil {
		return fmt.Errorf("the cluster record names profile %q: %w", rec.Profile, err)
	}
	in.sizing = cluster.Sizing{Profile: p, Storage: rec.Storage,
		ProfileReason: "recorded on the cluster", StorageReason: "recorded on the cluster; kip install never switches it"}
	in.network = rec.Network
	return nil
}

func (in *installer) confirm() error {
	q := fmt.Sprintf("Install Kipper on %s (%s profile, %s storage)?", in.o.Host, in.sizing.Profile.Name, in.sizing.Storage)
	if in.state.serverData {
		q = fmt.Sprintf("Re-run install on %s? k3s restarts to load kip's configuration: the API pauses for 10 to 30 seconds, running workloads keep running.", in.o.Host)
	}
	ok, err := in.env.Prompter.Confirm(q)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("install cancelled: nothing was changed")
	}
	return nil
}

// saveCluster saves the cluster in ~/.kip/config.yaml before anything changes on the host, so
// that an interrupted install can be found and continued.
func (in *installer) saveCluster() error {
	return in.env.Store.Update(func(cfg *config.Config) error {
		c := config.Cluster{Name: in.name, Host: in.o.Host, Kubeconfig: in.kubePath}
		if in.saved != nil {
			c = *in.saved
		}
		c.Kubeconfig = in.kubePath
		if in.env.SSHUserSet {
			c.SSHUser = in.env.SSHUser
		}
		if in.o.SSHPort != 0 {
			c.SSHPort = in.o.SSHPort
		}
		if key := in.env.SSHKey; key != "" {
			// Saved as a path that works from any directory kip is run in later.
			if !strings.HasPrefix(key, "~") && !filepath.IsAbs(key) {
				abs, err := filepath.Abs(key)
				if err != nil {
					return fmt.Errorf("--ssh-key %s: %w", key, err)
				}
				key = abs
			}
			c.SSHKey = key
		}
		cfg.Put(c)
		if cfg.Current == "" {
			cfg.Current = c.Name
		}
		return nil
	})
}

// summary ends the install with what was installed, where the kubeconfig is, and what next.
func (in *installer) summary() {
	in.p.Success(fmt.Sprintf("Kipper is installed on %s: %s profile, %s storage, k3s %s", in.o.Host, in.sizing.Profile.Name, in.sizing.Storage, in.move.To))
	in.p.Info("Kubeconfig: " + in.kubePath + " (saved for cluster " + in.name + ")")
	if url, err := components.ConsoleURL(in.address); err == nil {
		in.p.Info("Console: " + url + " (its certificate comes from Let's Encrypt once the name reaches the server on ports 80 and 443)")
	}
	if in.adminEmail != "" {
		in.p.Info("First admin: " + in.adminEmail + "; the password is in the cluster, print it with:")
		in.p.Info("  " + components.AdminPasswordCommand(in.kubePath))
	}
	in.p.Info("Next:")
	in.p.Info("  kip status                      the cluster's nodes, storage and components")
	in.p.Info("  kip doctor                      check the cluster and its host")
	in.p.Info("  export KUBECONFIG=" + in.kubePath)
	if in.sizing.Profile.Name == cluster.ProfileNano && !in.record.Monitoring.Prometheus {
		in.p.Info("  kip platform enable prometheus  turn monitoring on when the server has room")
	}
}
