package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/clock"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/credential"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/platform"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/manifests"
)

// Options are kip upgrade's; cmd/kip fills them.
type Options struct {
	Kube     func() (*kube.Clients, error)
	Printer  *cli.Printer
	Prompter *cli.Prompter
	// Out is where the check's report goes.
	Out io.Writer
	// Holder is the command line, which the cluster lock and the progress record name.
	Holder     string
	KipVersion string

	// Check reports what the upgrade would fix and changes nothing (--check).
	Check bool
	// SkipSystem leaves the system components as they are (--skip-system).
	SkipSystem bool
	// RepairAutoscaling applies the autoscaling fixes without asking (--repair-autoscaling).
	RepairAutoscaling bool
	// SkipAutoscalingCheck upgrades although apps need a decision, leaving them as they are
	// (--skip-autoscaling-check).
	SkipAutoscalingCheck bool
	// ImageTag runs the console's images of a commit, by its full SHA (--image-tag).
	ImageTag string
	// SeedCredentialGrants grants each shared git credential whose allow-list was never set the
	// projects whose apps reference it, without asking (--seed-credential-grants).
	SeedCredentialGrants bool
	// K3s moves the nodes' k3s to the release this kip pins first (--k3s); AirgapBundle is the
	// directory its binary comes from (--airgap-bundle), "" to download it on each host.
	K3s          bool
	AirgapBundle string
	// Dial connects to a host over SSH with the cluster's SSH settings; Server is the saved
	// cluster's server address, "" for the cluster record's. Every upgrade but --check reaches
	// the server with it (serverRepair); nil leaves the hosts alone, which only the tests of the
	// upgrade's API part, which have no host, do.
	Dial   func(ctx context.Context, host string) (*sshx.Client, error)
	Server string
	// Saved is the cluster as this machine saved it, whose kubeconfig (the server's admin one)
	// the upgrade brings up to date with the server's first; nil when --kubeconfig chose the
	// cluster, a file kip does not keep.
	Saved *config.Cluster
	// Debugf prints -v lines.
	Debugf func(format string, args ...any)
}

// Workflow is the name of the upgrade's progress record.
const Workflow = "upgrade"

var commitSHA = regexp.MustCompile(`^[0-9a-f]{40}$`)

// validate refuses flags that do not go together, before anything connects.
func (o *Options) validate() error {
	if o.ImageTag != "" {
		if !commitSHA.MatchString(o.ImageTag) {
			return cli.Usagef("--image-tag %q is not a commit's full 40-character SHA (lower-case hex), as its images are tagged", o.ImageTag)
		}
		if !o.SkipSystem {
			return cli.Usagef("--image-tag needs --skip-system: the system components' step would restore the released images")
		}
	}
	if o.AirgapBundle != "" {
		if !o.K3s {
			return cli.Usagef("--airgap-bundle gives k3s's binary to --k3s: pass --k3s too, or drop --airgap-bundle")
		}
		if err := k3s.CheckBundleDir(o.AirgapBundle); err != nil {
			return &cli.UsageError{Err: err}
		}
	}
	if o.Check && (o.RepairAutoscaling || o.ImageTag != "" || o.SeedCredentialGrants) {
		return cli.Usagef("--check changes nothing: drop --repair-autoscaling, --seed-credential-grants and --image-tag, or drop --check to upgrade")
	}
	return nil
}

// upgrader is one kip upgrade or kip upgrade --check.
type upgrader struct {
	o      *Options
	p      *cli.Printer
	cl     *kube.Clients
	rec    cluster.Record
	pinned *manifests.Versions
	// kept are the releases the cluster runs of the components the upgrade keeps at theirs
	// (Longhorn and cert-manager, keptAtRelease), "" for one it does not run.
	kept map[string]string
	// id is the gateway identity of a *.kipper.run cluster.
	id identity
	// all are the cluster's components as its record describes them, Longhorn at the release
	// the cluster runs.
	all []components.Component
	// k3s is the move of --k3s.
	k3s k3sMove
	// server is the repair of the server's k3s configuration, nil when the hosts are left alone.
	server *serverRepair
}

// findings is what the check found.
type findings struct {
	// crds is the CRD guards' refusal, nil when the schemas may move; crdsSkipped says which
	// guard a build from source skipped.
	crds        error
	crdsSkipped string
	apps        Autoscaling
	// failed are the system components whose Helm release failed, each with its recovery;
	// not read with --skip-system.
	failed []platform.ChartVersion
	routes RouteCheck
	// k3s is --k3s's refusal, nil when k3s can move.
	k3s error
	// grants are the allow-lists the upgrade would seed, of the shared git credentials whose
	// list was never set and that apps reference; unused are such credentials no app references,
	// left unset.
	grants []credential.Grant
	unused []string
}

// blocked reports whether the check fails: kip upgrade would refuse, or an app needs a decision.
func (f findings) blocked() error {
	var why []string
	if f.crds != nil {
		why = append(why, "the Kipper schemas cannot move")
	}
	if f.k3s != nil {
		why = append(why, "k3s cannot move")
	}
	if n := len(f.apps.Decisions); n > 0 {
		why = append(why, fmt.Sprintf("%d %s a decision", n, cli.Plural(n, "app needs", "apps need")))
	}
	if n := len(f.failed); n > 0 {
		why = append(why, fmt.Sprintf("%d %s failed", n, cli.Plural(n, "system component's Helm release", "system components' Helm releases")))
	}
	if n := len(f.routes.Conflicts); n > 0 {
		why = append(why, fmt.Sprintf("%d %s with an installed Kipper component", n, cli.Plural(n, "route conflicts", "routes conflict")))
	}
	if len(why) == 0 {
		return nil
	}
	return &cli.DecisionError{Err: errors.New(strings.Join(why, ", and ") + " (listed above)")}
}

// Run is kip upgrade, and with Check kip upgrade --check.
func Run(ctx context.Context, o *Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	if !o.Check && !o.SkipSystem {
		// The system components' step asks first: refuse before connecting when nobody could answer.
		if err := o.Prompter.CanConfirm(); err != nil {
			return fmt.Errorf("kip upgrade asks before it reconciles the system components: %w; pass --yes to confirm it, or --skip-system to upgrade only the Kipper CRDs and the console", err)
		}
	}
	if !o.Check {
		if err := refreshKubeconfig(ctx, o); err != nil {
			return err
		}
	}
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	u, err := newUpgrader(ctx, o, cl)
	if err != nil {
		return err
	}
	f, err := u.check(ctx)
	if err != nil {
		return err
	}
	if o.Check {
		return f.blocked()
	}
	return u.upgrade(ctx, f)
}

// newUpgrader reads what the upgrade starts from: the cluster record, the releases of the
// components kept at theirs, and the components rendered from them.
func newUpgrader(ctx context.Context, o *Options, cl *kube.Clients) (*upgrader, error) {
	rec, err := cluster.ReadInstalled(ctx, cl.Dynamic)
	if err != nil {
		return nil, err
	}
	pinned, err := manifests.Pinned()
	if err != nil {
		return nil, err
	}
	u := &upgrader{o: o, p: o.Printer, cl: cl, rec: rec, pinned: pinned, kept: map[string]string{}}
	for _, name := range keptAtRelease {
		if u.kept[name], err = components.ReadRelease(ctx, cl, name); err != nil {
			return nil, err
		}
	}
	if u.all, err = u.render(); err != nil {
		return nil, err
	}
	return u, nil
}

// check reads what the upgrade judges, through the API only, and reports it on Out.
func (u *upgrader) check(ctx context.Context) (findings, error) {
	var f findings
	f.crdsSkipped, f.crds = CheckCRDs(ctx, u.cl, u.o.KipVersion)
	apps, outside, err := ReadApps(ctx, u.cl)
	if err != nil {
		return f, err
	}
	f.apps = CheckApps(apps, outside, u.o.KipVersion)
	if u.id, err = readIdentity(ctx, u.cl, u.rec); err != nil {
		return f, err
	}
	routes, installed, err := ReadRoutes(ctx, u.cl)
	if err != nil {
		return f, err
	}
	f.routes = CheckRoutes(routes, installed)
	creds, err := credential.List(ctx, u.cl)
	if err != nil {
		return f, err
	}
	refs := map[string][]string{}
	for _, a := range apps {
		if a.Credential != "" {
			refs[a.Credential] = append(refs[a.Credential], a.Project)
		}
	}
	f.grants, f.unused = credential.Seeds(creds, refs)
	if u.o.K3s {
		if f.k3s, err = u.planK3s(ctx); err != nil {
			return f, err
		}
	}
	if !u.o.SkipSystem {
		if f.failed, err = platform.FailedReleases(ctx, u.cl, u.system(), u.rec.Server); err != nil {
			return f, err
		}
	}

	w := u.o.Out
	fmt.Fprintf(w, "Checking this cluster's data against the rules of kip %s...\n\n", u.o.KipVersion)
	switch {
	case f.crds != nil:
		fmt.Fprintf(w, "  ✗   %v\n", f.crds)
	case f.crdsSkipped != "":
		fmt.Fprintf(w, "  !   Kipper schemas: %s\n", f.crdsSkipped)
	default:
		fmt.Fprintf(w, "  ✔   The Kipper schemas can move to this kip's\n")
	}
	if u.o.K3s {
		u.k3s.write(w)
	}
	fmt.Fprintf(w, "  ·   The cluster CA and kip's admin certificate, and the server's k3s configuration (the API server's arguments, audit policy and login trust anchor), are checked over SSH when kip upgrade runs, even with --skip-system\n")
	if u.rec.Network == cluster.NetworkVXLAN {
		fmt.Fprintf(w, "  ·   The pod network runs VXLAN, which no worker can join: a full kip upgrade (not --skip-system) moves it to WireGuard, asking first, when the server can load the wireguard module\n")
	}
	if len(f.apps.Repairs)+len(f.apps.Decisions)+len(f.apps.AtZero) == 0 {
		fmt.Fprintf(w, "  ✔   Every app's autoscaling settings meet the new rules (%d %s)\n", len(apps), cli.Plural(len(apps), "app", "apps"))
	}
	f.apps.Write(w)
	if u.rec.Storage == cluster.StorageLonghorn {
		if err := warnLonghornHosts(ctx, w, u.cl); err != nil {
			return f, err
		}
	}
	if runs := u.kept["longhorn"]; runs != "" {
		if pin, err := u.pinned.Component("longhorn"); err == nil && pin.Version != runs {
			plan, first := longhornPlan(runs, pin.Version)
			fmt.Fprintf(w, "  !   %s\n", plan)
			// What would keep the first step from starting is --check's to say: a plain upgrade does
			// not move Longhorn, so it neither resolves the backup endpoint nor reads every pod.
			if first != nil && u.o.Check {
				if err := backup.CheckOutside(ctx, u.cl, u.rec, lookupNetIP); err != nil {
					fmt.Fprintf(w, "  !   kip upgrade --longhorn needs backups outside the cluster, and would refuse to start: %v\n", err)
				}
				blockers, err := longhornBlockers(ctx, u.cl, *first)
				if err != nil {
					return f, err
				}
				for _, b := range blockers {
					fmt.Fprintf(w, "  !   Before the step to Longhorn %s: %s\n", first.Version, b)
				}
			}
		}
	}
	if runs := u.kept["cert-manager"]; runs != "" && !u.o.SkipSystem {
		if pin, err := u.pinned.Component("cert-manager"); err == nil && pin.Version != runs {
			fmt.Fprintf(w, "  ·   cert-manager stays at %s, the release the cluster runs, with this kip's settings (its DNS resolvers); a re-run of kip install moves it to %s\n", runs, pin.Version)
		}
	}
	f.routes.Write(w)
	credential.WriteSeeds(w, f.grants, f.unused)
	for _, c := range f.failed {
		fmt.Fprintf(w, "  ✗   The Helm release of %s (%s) failed, and helm-controller would hang resetting it. Recover it first, on the server:\n", c.Component, c.Namespace)
		for _, line := range c.Fix {
			fmt.Fprintf(w, "          %s\n", line)
		}
	}
	if msg, warn := u.id.say(); msg != "" {
		mark := "·"
		if warn {
			mark = "!"
		}
		fmt.Fprintf(w, "  %s   %s\n", mark, msg)
	}
	fmt.Fprintln(w)
	return f, nil
}

// upgradeIntent is what the upgrade decided, kept in its progress record so that a resumed
// upgrade restarts the console only once.
type upgradeIntent struct {
	// Restart marks the console Deployments' pod templates (upgradedAtAnnotation).
	Restart string `json:"restart"`
	// Network is the flannel backend the pod network moves to (wireguard-native), "" when the
	// upgrade does not move it: a resumed upgrade finishes the move even with --skip-system.
	Network string `json:"network,omitempty"`
}

// upgrade asks what it must, then runs the upgrade under the cluster lock.
func (u *upgrader) upgrade(ctx context.Context, f findings) error {
	if f.crds != nil {
		return f.crds
	}
	if f.k3s != nil {
		return k3sRefused(f.k3s)
	}
	if n := len(f.failed); n > 0 {
		return fmt.Errorf("%d %s failed (listed above). Nothing was changed: recover %s as shown, then run kip upgrade again, "+
			"or run kip upgrade --skip-system to upgrade only the Kipper CRDs and the console", n,
			cli.Plural(n, "system component's Helm release", "system components' Helm releases"), cli.Plural(n, "it", "them"))
	}
	if n := len(f.apps.Decisions); n > 0 {
		if !u.o.SkipAutoscalingCheck {
			return &cli.DecisionError{Err: fmt.Errorf("%d %s a decision (listed above). Nothing was changed: decide as shown, "+
				"or pass --skip-autoscaling-check to upgrade and leave %s as %s", n, cli.Plural(n, "app needs", "apps need"),
				cli.Plural(n, "it", "them"), cli.Plural(n, "it is", "they are"))}
		}
		u.p.Warn(fmt.Sprintf("Leaving %d %s that %s a decision as %s (--skip-autoscaling-check)", n, cli.Plural(n, "app", "apps"), cli.Plural(n, "needs", "need"), cli.Plural(n, "it is", "they are")))
	}
	if removals := f.routes.Removals(); len(removals) > 0 {
		ok, err := u.o.Prompter.Confirm(fmt.Sprintf("Remove the %d conflicting %s Kipper manages (listed above)?", len(removals), cli.Plural(len(removals), "route", "routes")))
		if errors.Is(err, cli.ErrYesRequired) {
			return fmt.Errorf("removing the conflicting routes listed above needs confirmation: %w. Nothing was changed", err)
		}
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("the conflicting routes were not to be removed. Nothing was changed: rename the apps or services as shown, then run kip upgrade again")
		}
	}
	approved := f.apps.Repairs
	if len(approved) > 0 && !u.o.RepairAutoscaling {
		ok, err := u.o.Prompter.Ask("Apply these fixes?")
		if errors.Is(err, cli.ErrNoTerminal) {
			return fmt.Errorf("the autoscaling fixes listed above need your consent, and %w. Nothing was changed: pass --repair-autoscaling to apply them", err)
		}
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("the autoscaling fixes were not approved. Nothing was changed: set the apps as you want them with kip app scale or kip app autoscale, " +
				"or run kip upgrade again and approve the fixes")
		}
	}
	grants, err := u.seedConsent(f.grants)
	if err != nil {
		return err
	}
	if !u.o.SkipSystem {
		ok, err := u.o.Prompter.Confirm("Reconcile the system components at this kip's versions? Pods of a component that changes restart, which can briefly disrupt running workloads")
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("the system components were not confirmed. Nothing was changed: run kip upgrade --skip-system to upgrade only the Kipper CRDs and the console")
		}
	}
	r := workflow.OnCluster(u.cl, u.o.Holder, u.o.KipVersion, u.p)
	if u.o.Dial != nil {
		// The API that holds the lock goes away while the server's k3s restarts (--k3s, or the
		// repair of its configuration).
		r.Lock = workflow.ClusterLock(u.cl.Kube, kube.LockOptions{LeaseDuration: kube.RestartLeaseDuration})
	}
	lock, release, err := r.TakeLock(ctx)
	if err != nil {
		return err
	}
	defer release()
	r.Held = lock
	// Under the lock, the guards again: another kip may have written the schemas meanwhile.
	if _, err := CheckCRDs(ctx, u.cl, u.o.KipVersion); err != nil {
		return err
	}
	if u.o.K3s {
		// And the k3s move, which the steps follow: a join may have started (and stopped)
		// since the check.
		if refused, err := u.planK3s(ctx); err != nil || refused != nil {
			if err == nil {
				err = k3sRefused(refused)
			}
			return err
		}
	}
	intent := upgradeIntent{Restart: clock.Now().UTC().Format(time.RFC3339)}
	if _, err := workflow.Unfinished(ctx, u.cl.Dynamic, kube.ClusterRecords(), Workflow, &intent); err != nil {
		return err
	}
	if u.o.Dial != nil {
		if u.server, err = u.readServer(ctx, &intent); err != nil {
			return err
		}
	}
	steps, err := u.steps(intent, approved, f.routes.Removals(), grants)
	if err != nil {
		return err
	}
	err = r.Run(ctx, &workflow.Workflow{Name: Workflow, Intent: &intent, Steps: steps})
	if u.server != nil && u.o.Debugf != nil {
		u.o.Debugf("%d remote commands on the server over SSH", u.server.change.C.Commands())
	}
	if err != nil {
		return fmt.Errorf("kip upgrade: %w; run kip upgrade again to go on", err)
	}
	if u.server != nil && u.server.login {
		u.p.Success("Operator login configured: the API server accepts operators' logins through " + u.server.issuer + ", and the admin kubeconfig keeps working")
	}
	u.p.Success(fmt.Sprintf("Upgraded to kip %s", u.o.KipVersion))
	return nil
}

// seedConsent asks whether to seed the allow-lists the check listed (grants), unless
// --seed-credential-grants: the grants approved, none when declined or when nobody can answer
// (a credential whose list was never set keeps serving every project, as before, so the upgrade
// goes on and says how to seed them later).
func (u *upgrader) seedConsent(grants []credential.Grant) ([]credential.Grant, error) {
	if len(grants) == 0 || u.o.SeedCredentialGrants {
		return grants, nil
	}
	later := "kip upgrade --seed-credential-grants, or kip credentials allow, sets them later"
	ok, err := u.o.Prompter.Ask(fmt.Sprintf("Grant the %d shared git %s listed above the projects whose apps use %s?",
		len(grants), cli.Plural(len(grants), "credential", "credentials"), cli.Plural(len(grants), "it", "them")))
	switch {
	case errors.Is(err, cli.ErrNoTerminal):
		u.p.Warn("Leaving the shared git credentials' allow-lists unset: " + err.Error() + "; " + later)
		return nil, nil
	case err != nil:
		return nil, err
	case !ok:
		u.p.Info("Leaving the shared git credentials' allow-lists unset; " + later)
		return nil, nil
	}
	return grants, nil
}

// reconciled are the system components the upgrade re-applies (spec 002's scope table), in
// install order as Render gives them: at their pins, but Longhorn and cert-manager at the
// releases the cluster runs (keptAtRelease) with the values kip pins (Longhorn's settings,
// cert-manager's DNS resolvers). Dex is not re-applied (a re-render of its configuration would
// delete the console's users), and kip's own objects and the console are the console layer's.
var reconciled = map[string]bool{
	"traefik": true, "cert-manager": true, "longhorn": true, "zot": true, "keda": true, "minio": true,
	"velero": true, "prometheus": true, "loki": true,
}

// longhornPlan is --check's line on a cluster whose Longhorn is not at the release this kip
// pins: the steps that move it, one minor at a time (spec 002: --check lists them), or why
// none can; first is the first step's release, nil when there is none.
func longhornPlan(runs, pin string) (line string, first *longhorn.Release) {
	rs, err := longhorn.Steps(runs, pin)
	if err != nil {
		return "Longhorn stays at " + runs + ", the release the cluster runs: " + err.Error(), nil
	}
	var vs []string
	for _, r := range rs {
		vs = append(vs, r.Version)
	}
	if len(rs) > 0 {
		first = &rs[0]
	}
	return fmt.Sprintf("Longhorn stays at %s, the release the cluster runs; this kip pins %s, reached one minor at a time with kip upgrade --longhorn: %s", runs, pin, strings.Join(vs, ", then ")), first
}

// warnLonghornHosts warns about each node whose OS or kernel cannot run Longhorn (spec 002:
// Rocky Linux and AlmaLinux 9.7, Longhorn issue 13606), from what its Node reports.
func warnLonghornHosts(ctx context.Context, w io.Writer, cl *kube.Clients) error {
	nodes, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the cluster's nodes: %w", err)
	}
	for _, n := range nodes.Items {
		info := n.Status.NodeInfo
		if err := host.CheckLonghorn(host.NodeOS(info.OSImage), info.KernelVersion); err != nil {
			fmt.Fprintf(w, "  !   Node %s (%s, kernel %s): %v: %s\n", n.Name, info.OSImage, info.KernelVersion, err, host.LonghornOSFix)
		}
	}
	return nil
}

// longhornBlockers is what keeps the step onto next from starting: longhorn.CheckStep's, the
// nodes short of CPU for its new instance managers, and the volumes its backup could not hold.
func longhornBlockers(ctx context.Context, cl *kube.Clients, next longhorn.Release) ([]string, error) {
	blockers, err := longhorn.CheckStep(ctx, cl, next)
	if err != nil {
		return nil, err
	}
	pods, err := cl.Kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	services, err := service.CPUByNode(ctx, cl, pods.Items)
	if err != nil {
		return nil, err
	}
	cpu, err := longhorn.CheckManagerCPU(ctx, cl, next, pods.Items, services)
	if err != nil {
		return nil, err
	}
	unmounted, err := unmountedVolumes(ctx, cl)
	return append(append(blockers, cpu...), unmounted...), err
}

// lookupNetIP resolves a name from this machine.
func lookupNetIP(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// keptAtRelease are the components the upgrade re-applies at the release the cluster runs:
// kip upgrade --longhorn moves Longhorn one minor at a time, and a re-run of kip install moves
// cert-manager.
var keptAtRelease = []string{"longhorn", "cert-manager"}

// render renders the cluster's components as its record describes them, Longhorn and
// cert-manager at the releases the cluster runs (keptAtRelease).
func (u *upgrader) render() ([]components.Component, error) {
	o, err := components.Recorded(u.rec, u.pinned, u.o.KipVersion)
	if err != nil {
		return nil, err
	}
	o.Kept = u.kept
	return components.Render(o)
}

// system are the system components the upgrade reconciles, in install order.
func (u *upgrader) system() []components.Component {
	var out []components.Component
	for _, c := range u.all {
		if reconciled[c.Name] {
			out = append(out, c)
		}
	}
	return out
}

// base is kipper-base as the upgrade applies it: console-api's RBAC and the project roles,
// without the initial admin binding, which is left alone (its subjects change as admins come
// and go).
func (u *upgrader) base() components.Component {
	for _, c := range u.all {
		if c.Name == "kipper-base" {
			c.CreateOnly = nil
			return c
		}
	}
	return components.Component{Name: "kipper-base"}
}

// steps are the upgrade's, in spec 002's order: the Kipper CRDs, the console layer (console-api's
// RBAC, console-api and the console restarted), the system components unless skipped, and the
// approved autoscaling fixes last.
func (u *upgrader) steps(intent upgradeIntent, approved []*Finding, removals []IngressRef, grants []credential.Grant) ([]workflow.Step, error) {
	byName := map[string]components.Component{}
	for _, c := range u.all {
		byName[c.Name] = c
	}
	crds := components.Step(u.cl, byName["kipper-crds"])
	crds.Title, crds.Done, crds.Already = "Update the Kipper CRDs", "Updated the Kipper CRDs", "The Kipper CRDs are up to date"
	base := u.base()
	rbac := components.Step(u.cl, base)
	rbac.Title, rbac.Done, rbac.Already = "Update console-api's RBAC and the project roles", "Updated console-api's RBAC and the project roles", "console-api's RBAC and the project roles are up to date"
	var steps []workflow.Step
	if u.server != nil {
		steps = append(steps, u.server.step(u))
	}
	if u.o.K3s {
		steps = append(steps, u.k3sSteps()...)
	}
	steps = append(steps, crds, rbac)
	// A conflicting route takes the requests of a Kipper component's: it goes before the console
	// restarts.
	for _, ref := range removals {
		steps = append(steps, workflow.Step{
			Name: "remove-route-" + ref.Namespace + "-" + ref.Name, Title: "Remove the conflicting route " + ref.String(),
			Done: "Removed the conflicting route " + ref.String(), Already: "The conflicting route " + ref.String() + " is gone",
			Check: func(ctx context.Context) (bool, error) { return RouteRemoved(ctx, u.cl, ref) },
			Apply: func(ctx context.Context) error { return RemoveRoute(ctx, u.cl, ref) },
		})
	}
	console, err := consoleSteps(u.cl, byName["console"], u.o.ImageTag, intent.Restart)
	if err != nil {
		return nil, err
	}
	steps = append(steps, console...)
	if id := identityStep(u.cl, u.id); id != nil {
		steps = append(steps, *id)
	}
	moved := []components.Component{byName["kipper-crds"], base, byName["console"]}
	if u.o.K3s {
		moved = append(moved, components.Component{Name: "k3s", Version: u.k3s.to})
	}
	if !u.o.SkipSystem {
		for _, c := range u.system() {
			s := components.Step(u.cl, c)
			title := c.Name + " " + c.Version
			s.Title, s.Done, s.Already = "Reconcile "+title, "Reconciled "+title, title+" already as this kip pins it"
			if slices.Contains(keptAtRelease, c.Name) {
				s.Already = title + " already has this kip's settings (at the release the cluster runs)"
			}
			steps = append(steps, s)
			if c.Name == "longhorn" {
				// As install does: single-copy volumes stay on the server.
				steps = append(steps, longhorn.PlacementStep(u.cl))
			}
			moved = append(moved, c)
		}
	}
	if len(grants) > 0 {
		steps = append(steps, credential.SeedStep(u.cl, grants, u.p))
	}
	steps = append(steps, u.recordStep(moved))
	if len(approved) > 0 {
		steps = append(steps, u.fixesStep(approved))
	}
	return steps, nil
}

// recordStep records on the cluster record the kip that upgraded the cluster and the versions
// of the components it moved.
func (u *upgrader) recordStep(moved []components.Component) workflow.Step {
	mutate := func(r *cluster.Record) {
		r.KipVersion = u.o.KipVersion
		if r.Versions == nil {
			r.Versions = map[string]string{}
		}
		for _, c := range moved {
			if c.Version != "" {
				r.Versions[c.Name] = c.Version
			}
		}
	}
	return workflow.Step{
		Name: "cluster-record", Title: "Record the upgrade on the cluster record", Done: "Recorded the upgrade",
		Already: "The cluster record already names this upgrade",
		Check: func(ctx context.Context) (bool, error) {
			rec, err := cluster.ReadInstalled(ctx, u.cl.Dynamic)
			if err != nil {
				return false, err
			}
			want := rec
			want.Versions = maps.Clone(rec.Versions)
			mutate(&want)
			return rec.Same(want), nil
		},
		Apply: func(ctx context.Context) error {
			_, err := cluster.UpdateRecord(ctx, u.cl.Dynamic, func(r *cluster.Record, _ bool) error { mutate(r); return nil })
			return err
		},
	}
}

// fixesStep writes the approved autoscaling fixes once the new console-api serves alone. When
// that cannot be confirmed it writes none, says why, and lets the upgrade finish: the next kip
// upgrade finds and offers them again.
func (u *upgrader) fixesStep(approved []*Finding) workflow.Step {
	deferred := false
	return workflow.Step{
		Name: "autoscaling-fixes", Title: "Write the approved autoscaling fixes",
		Done: "Wrote the approved autoscaling fixes", Already: "The approved autoscaling fixes are written",
		Check: func(ctx context.Context) (bool, error) {
			if deferred {
				return true, nil
			}
			for _, f := range approved {
				fresh, _, err := readApp(ctx, u.cl, f.App)
				if apierrors.IsNotFound(err) {
					continue
				}
				if err != nil {
					return false, fmt.Errorf("read app %s: %w", f.App, err)
				}
				if now := CheckApp(fresh, u.o.KipVersion); now != nil && now.Kind == Repair && sameFix(f.Fix, now.Fix) {
					return false, nil
				}
			}
			return true, nil
		},
		Apply: func(ctx context.Context) error {
			alone, pending, err := kube.ServingAlone(ctx, u.cl, consoleNamespace, "console-api")
			if err != nil || !alone {
				why := pending
				if err != nil {
					why = err.Error()
				}
				u.p.Warn("Wrote no autoscaling fix: kip cannot confirm that the new console-api serves alone (" + why + "). Run kip upgrade again to apply them")
				deferred = true
				return nil
			}
			now := clock.Now()
			for _, f := range approved {
				out, err := writeFix(ctx, u.cl, f, u.o.KipVersion, now)
				if err != nil {
					return err
				}
				if out.written {
					u.p.Info(fmt.Sprintf("Fixed %s: %s", out.app, strings.Join(f.Changes, ", ")))
				} else {
					u.p.Warn(fmt.Sprintf("Left %s as it is: %s", out.app, out.why))
				}
			}
			return nil
		},
	}
}
