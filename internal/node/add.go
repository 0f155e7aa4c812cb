package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/manifests"
)

// AddOptions is what kip node add was asked to do, and what it takes from the command around it.
type AddOptions struct {
	Host string // HOST: the new worker, as kip reaches it over SSH
	// PrivateNetwork is --private-network ("" for none), Public --public.
	PrivateNetwork string
	Public         bool
	// Firewall is --firewall (true) or --firewall=false; nil manages the new node's firewall when
	// kip manages the server's.
	Firewall *bool
	NoCopies bool // --no-copies
	// AirgapBundle is a directory with the k3s release's binary and checksum file; "" downloads
	// them on the host.
	AirgapBundle string
	DryRun       bool

	Env
}

// flags are the options a resumed join must repeat, as its progress record keeps them.
type flags struct {
	PrivateNetwork string `json:"privateNetwork,omitempty"`
	Public         bool   `json:"public,omitempty"`
	Firewall       *bool  `json:"firewall,omitempty"`
	NoCopies       bool   `json:"noCopies,omitempty"`
}

func (o *AddOptions) flags() flags {
	return flags{PrivateNetwork: o.PrivateNetwork, Public: o.Public, Firewall: o.Firewall, NoCopies: o.NoCopies}
}

// differences names each option in which g (this run) differs from f (the unfinished join).
func (f flags) differences(g flags) []string {
	var d []string
	word := func(set bool, on string) string {
		if set {
			return on
		}
		return "without it"
	}
	if f.PrivateNetwork != g.PrivateNetwork {
		d = append(d, fmt.Sprintf("--private-network: started %s, now %s",
			word(f.PrivateNetwork != "", "with "+f.PrivateNetwork), word(g.PrivateNetwork != "", "with "+g.PrivateNetwork)))
	}
	if f.Public != g.Public {
		d = append(d, fmt.Sprintf("--public: started %s, now %s", word(f.Public, "with it"), word(g.Public, "with it")))
	}
	fw := func(b *bool) string {
		switch {
		case b == nil:
			return "without --firewall"
		case *b:
			return "with --firewall"
		}
		return "with --firewall=false"
	}
	if fw(f.Firewall) != fw(g.Firewall) {
		d = append(d, fmt.Sprintf("--firewall: started %s, now %s", fw(f.Firewall), fw(g.Firewall)))
	}
	if f.NoCopies != g.NoCopies {
		d = append(d, fmt.Sprintf("--no-copies: started %s, now %s", word(f.NoCopies, "with it"), word(g.NoCopies, "with it")))
	}
	return d
}

// Validate checks the options before anything connects anywhere.
func (o *AddOptions) Validate() error {
	if err := cli.CheckHost("HOST", o.Host); err != nil {
		return err
	}
	if o.PrivateNetwork != "" {
		p, err := netip.ParsePrefix(o.PrivateNetwork)
		if err != nil {
			return cli.Usagef("--private-network %q: give an IPv4 network in CIDR form, e.g. --private-network 10.0.0.0/16", o.PrivateNetwork)
		}
		if err := CheckNetwork(p); err != nil {
			return &cli.UsageError{Err: err}
		}
		if o.Public {
			return cli.Usagef("--public and --private-network exclude each other: pass one")
		}
	}
	if o.AirgapBundle != "" {
		if err := k3s.CheckBundleDir(o.AirgapBundle); err != nil {
			return &cli.UsageError{Err: err}
		}
	}
	return nil
}

func (o *AddOptions) want() Want {
	w := Want{Public: o.Public}
	if o.PrivateNetwork != "" {
		w.PrivateNetwork = netip.MustParsePrefix(o.PrivateNetwork) // Validate parsed it
	}
	return w
}

// joinIntent is what a join decided, kept in its progress record: a resumed join repeats the
// same options and continues with the same decisions.
type joinIntent struct {
	Options flags        `json:"options"`
	Node    string       `json:"node"`
	Path    cluster.Path `json:"path"`
	// Firewall: kip manages the new node's firewall.
	Firewall bool `json:"firewall"`
	// Cordoned: kip cordoned the node for the checks (a rejoin), and uncordons it after.
	Cordoned bool `json:"cordoned,omitempty"`
	// Restart: k3s-agent must restart to load the configuration kip wrote, in a run other than
	// AgentRun (systemd's InvocationID when kip wrote it; "" when it did not run).
	Restart  bool   `json:"restart,omitempty"`
	AgentRun string `json:"agentRun,omitempty"`
	// Fresh: the node was not in the cluster when the join started, so kip sets the host's
	// kernel parameters (an operator may have tuned a node's since it joined).
	Fresh    bool   `json:"fresh,omitempty"`
	VerifyID string `json:"verifyID"`
}

// joiner is one run of kip node add.
type joiner struct {
	o       *AddOptions
	p       *cli.Printer
	cl      *kube.Clients
	rec     cluster.Record
	nodes   cluster.Nodes
	started time.Time

	hosts
	serverFacts *sshx.Facts
	nodeFacts   *sshx.Facts
	family      host.Family
	version     string // the server's k3s release, which the worker joins at
	binary      k3s.BinaryInstall
	token       []byte // the server's join token: never printed
	intent      joinIntent
	// serverMove: the server's k3s moves onto the private network (the first private join).
	serverMove   bool
	serverPublic netip.Addr
	// fwServer: kip manages the server's firewall.
	fwServer bool
	// nodeFirewall is what the new node's firewall is.
	nodeFirewall host.FirewallState
	existed      bool // the Node is in the cluster
	// fenced is the fence of the worker kip rejoins, nil when it is not fenced.
	fenced *cluster.FenceRecord
	// serverAtStart is the server's Node as the join found it.
	serverAtStart *corev1.Node
}

// workflowName is the join's progress record for host.
func workflowName(h string) string {
	return "node-add-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '-'
	}, h)
}

// Add joins HOST to the cluster as a worker, or resumes or repeats its join.
func Add(ctx context.Context, o *AddOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if !o.DryRun {
		if err := o.Prompter.CanConfirm(); err != nil {
			return err
		}
	}
	j := &joiner{o: o, p: o.Printer, started: time.Now()}
	defer j.close()
	if err := j.examine(ctx); err != nil {
		return err
	}
	if err := j.decide(ctx); err != nil {
		return err
	}
	if j.serverMove && !o.DryRun {
		ok, err := o.Prompter.Confirm(fmt.Sprintf("Move the server's k3s onto the private network %s for the nodes? k3s restarts on the server: "+
			"the Kubernetes API, kip commands, console actions and apps that call the API pause, usually for 10 to 30 seconds and longer on small or busy servers; running containers keep running.",
			j.intent.Path.Network))
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("node add cancelled: nothing was changed")
		}
	}
	// The lease outlasts the server's k3s restart, whose API holds the lock.
	r := o.runner(j.cl, o.DryRun, kube.LockOptions{LeaseDuration: 5 * time.Minute})
	if err := r.Run(ctx, &workflow.Workflow{Name: workflowName(o.Host), Intent: &j.intent, Steps: j.measured(j.steps())}); err != nil {
		return err
	}
	if !o.DryRun {
		j.summary(ctx)
	}
	return nil
}

// measured wraps each step's Apply so that -v says how long it took and how many remote commands
// it ran on every host.
func (j *joiner) measured(steps []workflow.Step) []workflow.Step {
	for i := range steps {
		apply, name := steps[i].Apply, steps[i].Name
		steps[i].Apply = func(ctx context.Context) error {
			before, began := j.commands(), time.Now()
			err := apply(ctx)
			j.o.Debugf("step %s: %d remote commands, %s", name, j.commands()-before, time.Since(began).Round(time.Millisecond))
			return err
		}
	}
	return steps
}

// examine reads the cluster and reaches every host the join touches, refusing what kip node add
// refuses before anything changes.
func (j *joiner) examine(ctx context.Context) error {
	var err error
	if j.cl, err = j.o.Kube(); err != nil {
		return err
	}
	if j.rec, err = cluster.ReadInstalled(ctx, j.cl.Dynamic); err != nil {
		return err
	}
	switch {
	case j.rec.Storage != cluster.StorageLonghorn:
		return errors.New("this cluster keeps its data on the server's local storage until the cluster grows onto Longhorn, and workers hold Longhorn volumes: " +
			"run 'kip cluster storage longhorn' first, then kip node add")
	case j.rec.Network != cluster.NetworkWireGuard:
		return errors.New("the server's pod network runs VXLAN, and workers join only a WireGuard pod network (traffic between nodes travels inside WireGuard): " +
			"run 'kip upgrade' first, which moves the pod network to WireGuard once the server can load the wireguard module (it could not when kip installed it), then kip node add")
	}
	if j.nodes, err = cluster.ReadNodes(ctx, j.cl.Dynamic); err != nil {
		return err
	}
	j.p.Info("Connecting to the server and to " + j.o.Host)
	if j.server, err = j.o.dialServer(ctx, j.rec, "kip node add reaches the server over SSH to copy its join token and update its firewall"); err != nil {
		return err
	}
	if j.node, err = j.o.Dial(ctx, j.o.Host); err != nil {
		return err
	}
	if j.serverFacts, err = j.server.Facts(ctx); err != nil {
		return err
	}
	if j.nodeFacts, err = j.node.Facts(ctx, cluster.RancherDir, cluster.LonghornDir); err != nil {
		return err
	}
	if err := j.preflight(ctx); err != nil {
		return err
	}
	if j.family, err = host.Identify(j.nodeFacts.OS); err != nil {
		return err
	}
	name, err := j.node.Query(ctx, "hostname")
	if err != nil {
		return fmt.Errorf("read the host's name: %w", err)
	}
	j.intent.Node = strings.TrimSpace(string(name))
	return j.checkNodes(ctx)
}

// preflight refuses a host that cannot be a worker: the OS, IPv4, the wireguard module,
// Longhorn's rules for the OS and its kernel modules, systemd, a k3s server already there.
func (j *joiner) preflight(ctx context.Context) error {
	f := j.nodeFacts
	var failed []string
	if _, err := host.Identify(f.OS); err != nil {
		failed = append(failed, err.Error())
	}
	if _, err := f.NodeIP(j.node.Host()); err != nil {
		failed = append(failed, err.Error()+": a worker needs an IPv4 address")
	}
	if !f.Modules["wireguard"].Usable() {
		failed = append(failed, "the wireguard kernel module cannot load, and the pod network between nodes runs inside WireGuard: "+host.WireGuardFix)
	}
	if err := host.CheckLonghorn(f.OS, f.Kernel); err != nil {
		failed = append(failed, err.Error()+": "+host.LonghornOSFix)
	}
	if missing, fix := host.MissingStorageModules(f.Modules, f.OS, f.Kernel); len(missing) > 0 {
		failed = append(failed, "Longhorn needs the "+strings.Join(missing, " and ")+" kernel module(s), which cannot load: "+fix)
	}
	if f.Init != "systemd" {
		failed = append(failed, "the host runs "+f.Init+", not systemd, which k3s needs")
	}
	res, err := j.node.Probe(ctx, "test -d /var/lib/rancher/k3s/server")
	if err != nil {
		return err
	}
	if res.ExitStatus == 0 {
		failed = append(failed, "k3s has run as a server on this host (/var/lib/rancher/k3s/server exists): a worker joins from a host that is no cluster's server")
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s cannot join as a worker: %s", j.o.Host, strings.Join(failed, "; "))
	}
	return nil
}

// checkNodes refuses a cluster with a worker kip did not record, and reaches every recorded
// worker, whose firewall a join updates.
func (j *joiner) checkNodes(ctx context.Context) error {
	list, err := j.cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for i := range list.Items {
		n := &list.Items[i]
		info := cluster.Info(n)
		if n.Name == j.intent.Node {
			j.existed = true
		}
		if info.Role == cluster.RoleServer {
			j.serverAtStart = n
		}
		if info.Role == cluster.RoleWorker && n.Name != j.intent.Node {
			if _, ok := j.nodes.Workers[n.Name]; !ok {
				return fmt.Errorf("node %s is a worker kip did not record: run kip node add <host> for that worker first to adopt it, then add %s", n.Name, j.o.Host)
			}
		}
		if (info.Status == cluster.NodeOutOfService || j.nodes.Workers[n.Name].Fence != nil) && n.Name != j.intent.Node {
			return fmt.Errorf("node %s is fenced (out of service): a join updates every node, and kip cannot reach a fenced node; rejoin it with kip node add %s first, "+
				"or, when its host is gone for good, give it up with kip node remove %s --force", n.Name, j.nodes.Workers[n.Name].Host, n.Name)
		}
	}
	if j.serverAtStart == nil {
		return errors.New("the cluster has no server node")
	}
	j.peers, err = dialPeers(ctx, j.o.Dial, j.nodes, j.intent.Node, "a join")
	return err
}

// decide settles, before anything changes, the path, the firewalls, the k3s release and the
// token; a resumed join must repeat the options it started with.
func (j *joiner) decide(ctx context.Context) error {
	var before joinIntent
	p, err := workflow.Unfinished(ctx, j.cl.Dynamic, kube.ClusterRecords(), workflowName(j.o.Host), &before)
	if err != nil {
		return err
	}
	j.intent.Options, j.intent.VerifyID, j.intent.Fresh = j.o.flags(), rand.String(5), !j.existed
	if p != nil {
		if d := before.Options.differences(j.o.flags()); len(d) > 0 {
			return fmt.Errorf("an unfinished kip node add of %s (%s) started with other options (%s): run it again with the options it started with to resume it",
				j.o.Host, p.StartedBy, strings.Join(d, "; "))
		}
		// The resumed join keeps what it decided when it started; the steps are built from it.
		j.intent.Fresh, j.intent.Cordoned, j.intent.Restart, j.intent.AgentRun, j.intent.VerifyID = before.Fresh, before.Cordoned, before.Restart, before.AgentRun, before.VerifyID
	}

	serverPublic, err := j.serverFacts.NodeIP(j.rec.Server)
	if err != nil {
		return err
	}
	nodePublic, err := j.nodeFacts.NodeIP(j.node.Host())
	if err != nil {
		return err
	}
	var recorded *cluster.Path
	if w, ok := j.nodes.Workers[j.intent.Node]; ok {
		recorded, j.fenced = &w.Path, w.Fence
	}
	if j.fenced != nil {
		j.p.Info(fmt.Sprintf("Worker %s is fenced (since %s): kip lifts the fence step by step as it rejoins", j.intent.Node, j.fenced.At.Local().Format(time.DateTime)))
	}
	pub := func(s string) netip.Addr { a, _ := netip.ParseAddr(s); return a }
	choice, err := Choose(End{Facts: j.serverFacts, Public: pub(serverPublic)}, End{Facts: j.nodeFacts, Public: pub(nodePublic)}, j.o.want(), j.nodes.Mode, recorded)
	if err != nil {
		return err
	}
	if err := checkRejoinAddress(recorded, choice.Path, j.intent.Node); err != nil {
		return err
	}
	if recorded != nil && recorded.Node != choice.Path.Node {
		j.p.Info(fmt.Sprintf("Worker %s answers at %s on the private network, not at its recorded %s: kip records the new address, and the join makes its node publish it",
			j.intent.Node, choice.Path.Node, recorded.Node))
	}
	j.intent.Path = choice.Path
	if choice.Path.Mode == cluster.ModePrivate {
		if err := CheckPath(ctx, j.server, j.node, choice.Path, sshPort(j.node), j.nodes.Mode == ""); err != nil {
			return err
		}
	}
	if choice.Suggest {
		return fmt.Errorf("the only private network the hosts share, %s, carries their default route, and the connection checks over it pass: "+
			"to join over it, run kip node add %s --private-network %s; to join over public addresses, run kip node add %s --public",
			choice.Path.Network, j.o.Host, choice.Path.Network, j.o.Host)
	}
	j.p.Info(fmt.Sprintf("Network: %s (%s)", choice.Path, choice.How))
	j.serverPublic = pub(serverPublic)
	if choice.Path.Mode == cluster.ModePrivate {
		// The server's k3s moves onto the private network unless it already runs there (an
		// earlier join moved it, or this one before it was interrupted).
		j.serverMove = !slices.Contains(internalIPs(j.serverAtStart), choice.Path.Server.String())
	}

	// Firewalls.
	fw, err := host.ReadFirewall(ctx, j.server)
	if err != nil {
		return err
	}
	j.fwServer = fw.Active && fw.Managed
	if fw.Active && !fw.Managed && fw.Tool == "ufw" {
		return errors.New("ufw is active on the server and kip does not manage it: a join stops at an unmanaged ufw, even with the ports open; " +
			"turn it off (ufw disable) and run kip install again so that kip manages it, then kip node add")
	}
	for _, p := range j.peers {
		if p.firewall.Active && !p.firewall.Managed && p.firewall.Tool == "ufw" {
			return fmt.Errorf("ufw is active on worker %s and kip does not manage it: a join stops at an unmanaged ufw, even with the ports open; turn it off there (ufw disable), then run the same command again", p.name)
		}
	}
	if j.nodeFirewall, err = host.ReadFirewall(ctx, j.node); err != nil {
		return err
	}
	j.intent.Firewall = j.fwServer
	if j.o.Firewall != nil {
		j.intent.Firewall = *j.o.Firewall
	}
	if j.intent.Firewall && j.nodeFirewall.Active && !j.nodeFirewall.Managed {
		if j.nodeFirewall.Tool == "ufw" {
			return fmt.Errorf("ufw is active on %s and kip does not manage it: a join stops at an unmanaged ufw, even with the ports open; turn it off (ufw disable) so that kip manages it, or pass --firewall=false and open the ports yourself", j.o.Host)
		}
		j.intent.Firewall = false
		j.p.Warn(fmt.Sprintf("%s is active on %s and not managed by kip: kip leaves it alone", j.nodeFirewall.Tool, j.o.Host))
	}

	if serverFamily, _ := host.Identify(j.serverFacts.OS); j.fwServer && serverFamily.Firewall == "firewalld" || j.intent.Firewall && j.family.Firewall == "firewalld" {
		j.p.Warn("On Rocky Linux, AlmaLinux and CentOS Stream, applying kip's firewalld rules restarts k3s there: the join can interrupt the Kubernetes API briefly")
	}

	// k3s at the server's release, verified.
	if j.version, err = k3s.RemoteVersion(ctx, j.server, k3s.BinaryPath); err != nil || j.version == "" {
		return fmt.Errorf("read the server's k3s release (%s --version on the server): %v", k3s.BinaryPath, err)
	}
	j.binary = k3s.BinaryInstall{C: j.node, Version: j.version, Arch: j.nodeFacts.Arch}
	pinned, err := manifests.Pinned()
	if err != nil {
		return err
	}
	if pin, err := pinned.Component("k3s"); err != nil {
		return err
	} else if pin.Version == j.version {
		j.binary.Pinned = pin.SHA256
	}
	if j.o.AirgapBundle != "" {
		if j.binary.Bundle, err = k3s.LoadBundle(j.o.AirgapBundle, j.nodeFacts.Arch); err != nil {
			return err
		}
		if err := j.binary.CheckPinned(j.binary.Bundle.SHA256); err != nil {
			return err
		}
	}
	j.p.Info("k3s: " + j.version + ", the server's release")
	if j.token, err = j.server.Query(ctx, sshx.Command("cat", k3s.ServerTokenPath)); err != nil {
		return fmt.Errorf("read the server's join token (%s): %w", k3s.ServerTokenPath, err)
	}
	return nil
}

// checkRejoinAddress refuses to rejoin a worker at a new address in public mode: the other
// nodes reach it at its recorded one. In private mode the new address is recorded and published.
func checkRejoinAddress(recorded *cluster.Path, chosen cluster.Path, node string) error {
	if recorded == nil || recorded.Mode != cluster.ModePublic || chosen.Node == recorded.Node {
		return nil
	}
	return fmt.Errorf("worker %s answers at %s, and its recorded public address is %s: in public mode the other nodes reach it at that address, so kip does not rejoin it at another; "+
		"give the host its old address back, or remove the worker with kip node remove %s --force and add the host as a new worker",
		node, chosen.Node, recorded.Node, node)
}

// nodeNow is the joining node in the API, nil when it has not registered.
func (j *joiner) nodeNow(ctx context.Context) (*corev1.Node, error) {
	n, err := j.cl.Kube.CoreV1().Nodes().Get(ctx, j.intent.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", j.intent.Node, err)
	}
	return n, nil
}
