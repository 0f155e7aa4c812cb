package status

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/rest"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/manifests"
)

// CheckStatus is a check's outcome.
type CheckStatus string

// Check outcomes. Doctor exits 1 when any check failed.
const (
	StatusOK      CheckStatus = "ok"
	StatusWarn    CheckStatus = "warn"
	StatusFail    CheckStatus = "fail"
	StatusSkipped CheckStatus = "skipped"
)

// glyphSkipped leads a check that did not run.
const glyphSkipped = "-"

// Check is one doctor check: what was found and, unless it passed, the fix.
type Check struct {
	Name string `json:"name"`
	// Node is the node a per-node check looked at.
	Node   string      `json:"node,omitempty"`
	Status CheckStatus `json:"status"`
	Detail string      `json:"detail"`
	// Fix is the command or step that fixes a warning or failure, or, for a skipped check, how
	// to run it.
	Fix string `json:"fix,omitempty"`
	// Log is what the check read that explains it: the last journal lines of a k3s unit that
	// does not run.
	Log []string `json:"log,omitempty"`
	// ClockSkewSeconds is, for a clock check, the other clock minus this machine's in seconds
	// (positive: ahead), to the millisecond; ClockUncertaintySeconds is how far the measure may
	// be off (half the round trip, and the Date header's whole seconds).
	ClockSkewSeconds        *float64 `json:"clockSkewSeconds,omitempty"`
	ClockUncertaintySeconds *float64 `json:"clockUncertaintySeconds,omitempty"`
}

// title names the check and the node it looked at.
func (c Check) title() string {
	if c.Node == "" {
		return c.Name
	}
	return c.Name + " (" + c.Node + ")"
}

// sentence is the check as a warning in status: what it found, and the fix.
func (c Check) sentence() string {
	s := c.title() + ": " + c.Detail
	if c.Fix != "" {
		s += "; fix: " + c.Fix
	}
	return s
}

// Diagnosis is the documented shape of 'kip doctor -o json' (docs/status.md).
type Diagnosis struct {
	Checks  []Check `json:"checks"`
	Summary Summary `json:"summary"`
}

// Summary counts the checks by outcome.
type Summary struct {
	OK      int `json:"ok"`
	Warn    int `json:"warn"`
	Fail    int `json:"fail"`
	Skipped int `json:"skipped"`
}

// FailedError is Doctor's error when checks failed; the report already names them.
type FailedError struct{ Failed, Total int }

func (e *FailedError) Error() string {
	if e.Failed == 1 {
		return fmt.Sprintf("1 of %d checks failed", e.Total)
	}
	return fmt.Sprintf("%d of %d checks failed", e.Failed, e.Total)
}

// Doctor runs the checks, writes them to o.Out, and returns a *FailedError when any failed.
func Doctor(ctx context.Context, o *Options) error {
	d := Diagnose(ctx, o)
	var err error
	if o.JSON {
		err = cli.WriteJSON(o.Out, d)
	} else {
		err = d.WriteText(o.Out)
	}
	if err != nil {
		return err
	}
	if d.Summary.Fail > 0 {
		return &FailedError{Failed: d.Summary.Fail, Total: len(d.Checks)}
	}
	return nil
}

// doctor collects checks.
type doctor struct {
	o      *Options
	now    time.Time
	checks []Check
	// apiDown says the API did not answer (unreachable, or a gateway's 5xx), as opposed to
	// rejecting kip's credentials or not being configured.
	apiDown bool
}

func (d *doctor) add(c ...Check) { d.checks = append(d.checks, c...) }

// Diagnose runs every check: the API's first, then each node's over SSH. A check that cannot
// run is reported as skipped with the reason and how to run it.
func Diagnose(ctx context.Context, o *Options) *Diagnosis {
	d := &doctor{o: o, now: time.Now()}
	v := d.apiChecks(ctx)
	if u := d.hostChecks(ctx, v); u != nil && d.apiDown {
		d.explainAPIDown(u)
	}
	out := &Diagnosis{Checks: d.checks}
	for _, c := range d.checks {
		switch c.Status {
		case StatusOK:
			out.Summary.OK++
		case StatusWarn:
			out.Summary.Warn++
		case StatusFail:
			out.Summary.Fail++
		case StatusSkipped:
			out.Summary.Skipped++
		}
	}
	return out
}

// apiChecks runs the checks that need only the API. It returns what it read, nil when the API
// cannot be reached.
func (d *doctor) apiChecks(ctx context.Context) *view {
	c, err := d.o.Kube()
	if err != nil {
		fix := "pass --kubeconfig with the cluster's kubeconfig, or --cluster with a cluster saved by kip install"
		if errors.As(err, new(*cli.NoClusterError)) {
			fix = "install a cluster with 'kip install --host <server address>', or pass --kubeconfig with the kubeconfig of one kip did not install"
		}
		d.add(Check{Name: "api", Status: StatusFail, Detail: err.Error(), Fix: fix})
		d.skipAPI("no API clients")
		return nil
	}
	api, probe := checkAPI(ctx, c)
	d.add(api)
	if api.Status == StatusFail {
		d.apiDown = probe.down
		d.skipAPI("the API cannot be reached")
		return nil
	}
	skew, uncertainty := probe.skew()
	d.add(checkClock("", "the API server's", skew, uncertainty))

	v := &view{c: c}
	if err := v.readRecord(ctx); err != nil {
		d.add(Check{Name: "cluster record", Status: StatusFail, Detail: err.Error(), Fix: "upgrade kip if the record is newer than this kip; otherwise re-run kip install to write it again"})
	} else if !v.recorded {
		d.add(Check{Name: "cluster record", Status: StatusWarn,
			Detail: "no kip cluster record (kipper.run/cluster on configmaps/kipper-records in kube-system): kip did not install this cluster, or the record was deleted; the storage and kip version checks are skipped",
			Fix:    "if kip installed this cluster, running kip install --host SERVER again records it (read docs/install.md on re-running install first)"})
	}
	if err := v.readNodes(ctx); err != nil {
		d.add(Check{Name: "nodes", Status: StatusFail, Detail: err.Error(), Fix: "give kip's credentials the right to list nodes (kip's kubeconfig is the cluster admin's)"})
		return v
	}
	d.add(d.nodeChecks(v)...)
	d.add(checkK3sVersions(v.nodes, v.serverAddr(d.o)))
	if v.recorded {
		d.add(d.storageCheck(ctx, v))
		if v.rec.Storage == cluster.StorageLonghorn {
			d.add(d.longhornDiskChecks(ctx, v)...)
		}
		d.add(checkKipVersion(d.o.KipVersion, v.rec.KipVersion))
	}
	d.add(d.operationChecks(ctx, c)...)
	d.add(hopCertCheck(ctx, c)...)
	return v
}

// skipAPI reports the API checks that could not run.
func (d *doctor) skipAPI(why string) {
	d.add(Check{Name: "api checks", Status: StatusSkipped,
		Detail: why + ": nodes, k3s versions, storage mode, Longhorn disks, kip version and unfinished operations were not checked",
		Fix:    "fix the api check above, then run kip doctor again"})
}

// apiProbe is the API server's clock, read from its Date header, and when the request was sent
// and its answer received on this machine's clock; down says that the API did not answer.
type apiProbe struct {
	date, sent, received time.Time
	down                 bool
}

// skew is the API server's clock minus this machine's. The Date header is in whole seconds, so
// the server's time lies within the second after it: take its middle, and allow half a second
// more than half the round trip.
func (p apiProbe) skew() (skew, uncertainty time.Duration) {
	rtt := p.received.Sub(p.sent)
	mid := p.sent.Add(rtt / 2)
	return p.date.Add(500 * time.Millisecond).Sub(mid), rtt/2 + 500*time.Millisecond
}

// checkAPI asks the API server for its version with kip's credentials: one request that shows
// the server is reachable, accepts the credentials, and what its clock says.
func checkAPI(ctx context.Context, c *kube.Clients) (Check, apiProbe) {
	check := Check{Name: "api"}
	fail := func(detail, fix string) (Check, apiProbe) {
		check.Status, check.Detail, check.Fix = StatusFail, detail, fix
		return check, apiProbe{}
	}
	reachFix := fmt.Sprintf("check that the server is up and that this machine reaches %s (port 6443 open in the provider's firewall); the host checks below look at the server over SSH", c.Config.Host)
	hc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return fail(fmt.Sprintf("cannot build an HTTP client for %s: %v", c.Config.Host, err), "check the kubeconfig's certificates")
	}
	base, _, err := rest.DefaultServerUrlFor(c.Config)
	if err != nil {
		return fail(fmt.Sprintf("bad API address %q: %v", c.Config.Host, err), "fix the server address in the kubeconfig")
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base.JoinPath("version").String(), nil)
	if err != nil {
		return fail(err.Error(), reachFix)
	}
	req.Header.Set("Accept", "application/json")
	sent := time.Now()
	resp, err := hc.Do(req)
	received := time.Now()
	if err != nil {
		check, probe := fail(fmt.Sprintf("cannot reach the API at %s: %v", base, err), reachFix)
		probe.down = true
		return check, probe
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return fail(fmt.Sprintf("the API at %s rejected kip's credentials (401 Unauthorized)", base),
			"pass --kubeconfig with credentials the cluster accepts, or copy the server's /etc/rancher/k3s/k3s.yaml (with its server address changed to the server's) over the cluster's saved kubeconfig")
	case resp.StatusCode != http.StatusOK:
		check, probe := fail(fmt.Sprintf("the API at %s answered %s", base, resp.Status), reachFix)
		probe.down = resp.StatusCode >= 500
		return check, probe
	}
	var info struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := json.Unmarshal(body, &info); err != nil || info.GitVersion == "" {
		return fail(fmt.Sprintf("%s/version is not a Kubernetes API server's answer", base), "check the server address in the kubeconfig")
	}
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		date = received // no clock to compare: the clock check then shows no skew
	}
	check.Status = StatusOK
	check.Detail = fmt.Sprintf("%s answered with kip's credentials (Kubernetes %s)", base, info.GitVersion)
	return check, apiProbe{date: date, sent: sent, received: received}
}

// nodeChecks judges each node: Ready, not fenced, under no pressure.
func (d *doctor) nodeChecks(v *view) []Check {
	if len(v.nodes) == 0 {
		return []Check{{Name: "nodes", Status: StatusFail, Detail: "the cluster has no nodes", Fix: "check k3s on the server: systemctl status k3s; journalctl -u k3s"}}
	}
	var out []Check
	for i := range v.nodes {
		out = append(out, checkNode(&v.nodes[i], v.sshAddr(d.o, &v.nodes[i])))
	}
	return out
}

// checkNode judges one node; addr is where kip reaches it.
func checkNode(n *corev1.Node, addr string) Check {
	c := Check{Name: "node", Node: n.Name, Status: StatusOK}
	role := cluster.NodeRole(n)
	st := cluster.NodeStatus(n)
	switch st {
	case cluster.NodeOutOfService:
		c.Status = StatusWarn
		c.Detail = "OutOfService: fenced (tainted " + cluster.OutOfServiceTaint + "); it never counts as Ready"
		c.Fix = fmt.Sprintf("bring it back with 'kip node add %s', or give it up with 'kip node remove %s --force'", orName(addr, n.Name), n.Name)
		return c
	case cluster.NodeNotReady, cluster.NodeUnknown:
		c.Status = StatusFail
		c.Detail = st + readyReason(n)
		if role == cluster.RoleServer {
			c.Fix = "check k3s on the server: systemctl status k3s; journalctl -u k3s"
		} else {
			c.Fix = fmt.Sprintf("if k3s-agent on the worker logs 'not authorized', its certificates expired or are missing: run 'kip node add %s' again with the original options; if the worker is down, fence it once it has been NotReady for a minute: kip node fence %s",
				orName(addr, n.Name), n.Name)
		}
		return c
	}
	c.Detail = "Ready"
	if n.Spec.Unschedulable {
		c.Detail += ", cordoned (no new pods land there)"
	}
	var pressure []string
	for _, cond := range n.Status.Conditions {
		switch cond.Type {
		case corev1.NodeDiskPressure, corev1.NodeMemoryPressure, corev1.NodePIDPressure:
			if cond.Status == corev1.ConditionTrue {
				pressure = append(pressure, string(cond.Type))
			}
		}
	}
	if len(pressure) > 0 {
		c.Status = StatusWarn
		c.Detail += ", under " + strings.Join(pressure, " and ") + ": the kubelet evicts pods"
		c.Fix = "free disk space or memory on the node, or move workloads off it"
	}
	return c
}

func orName(addr, name string) string {
	if addr != "" {
		return addr
	}
	return name
}

func readyReason(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			var parts []string
			for _, s := range []string{c.Reason, c.Message} {
				if s != "" {
					parts = append(parts, s)
				}
			}
			if len(parts) > 0 {
				return " (" + strings.Join(parts, ": ") + ")"
			}
			return ""
		}
	}
	return " (it has not reported Ready yet)"
}

// sshAddr is where kip reaches node n over SSH: the server at the saved or recorded
// address when the cluster has one server, a worker kip joined where kip node add reached it,
// any other node at its external address, else its internal one.
func (v *view) sshAddr(o *Options, n *corev1.Node) string {
	if cluster.NodeRole(n) == cluster.RoleServer && len(v.servers()) == 1 {
		if a := v.serverAddr(o); a != "" {
			return a
		}
	}
	if w, ok := v.workers.Workers[n.Name]; ok && w.Host != "" {
		return w.Host // a worker kip joined: where kip node add reached it
	}
	if a := cluster.NodeAddress(n, corev1.NodeExternalIP); a != "" {
		return a
	}
	return cluster.NodeAddress(n, corev1.NodeInternalIP)
}

// rerunInstall is the command that moves the server's k3s onto the release this kip pins today:
// kip install run again on the server (docs/install.md, "Re-running install").
func rerunInstall(server string) string {
	return "kip install --host " + cmp.Or(server, "<server address>")
}

// checkK3sVersions compares each node's k3s with the release this kip pins. server is the
// server's SSH address, for the command that moves it.
func checkK3sVersions(nodes []corev1.Node, server string) Check {
	c := Check{Name: "k3s version", Status: StatusOK}
	pinned, err := pinnedK3s()
	if err != nil {
		c.Status, c.Detail = StatusWarn, err.Error()
		return c
	}
	var off []string
	var fixes []string
	addFix := func(f string) {
		for _, x := range fixes {
			if x == f {
				return
			}
		}
		fixes = append(fixes, f)
	}
	for i := range nodes {
		n := &nodes[i]
		installed := n.Status.NodeInfo.KubeletVersion
		m, err := k3s.PlanMove(installed, pinned)
		switch {
		case installed == "":
			off = append(off, n.Name+" reports no k3s version")
			addFix("look at the node's kubelet: kubectl describe node " + n.Name)
		case err != nil && strings.Contains(err.Error(), "never downgraded"):
			off = append(off, fmt.Sprintf("%s runs %s, newer than %s", n.Name, installed, pinned))
			addFix(fmt.Sprintf("upgrade kip: use a kip release that pins %s or later", installed))
		case err != nil:
			off = append(off, fmt.Sprintf("%s: %v", n.Name, err))
			addFix("look at the node's kubelet: kubectl describe node " + n.Name)
		case m.Kind == k3s.KeepBehind && cluster.NodeRole(n) == cluster.RoleServer:
			off = append(off, m.Warning)
			addFix(fmt.Sprintf("kip install keeps a server more than one Kubernetes minor behind: upgrade its k3s by hand one minor at a time, as the warning says, then run '%s' again to reach %s", rerunInstall(server), pinned))
		case m.Kind == k3s.Upgrade && cluster.NodeRole(n) == cluster.RoleServer:
			off = append(off, fmt.Sprintf("%s runs %s", n.Name, installed))
			addFix(fmt.Sprintf("run '%s' again: it moves the server's k3s to %s and restarts k3s (read \"Re-running install\" in docs/install.md first)", rerunInstall(server), pinned))
		case m.Kind == k3s.KeepBehind || m.Kind == k3s.Upgrade:
			off = append(off, fmt.Sprintf("%s runs %s", n.Name, installed))
			addFix(fmt.Sprintf("run '%s' again: after the server, it brings each ready worker to the server's k3s, one at a time and without a drain", rerunInstall(server)))
		}
	}
	if len(off) == 0 {
		c.Detail = fmt.Sprintf("every node runs %s, the release this kip pins", pinned)
		return c
	}
	c.Status = StatusWarn
	c.Detail = fmt.Sprintf("this kip pins %s: %s", pinned, strings.Join(off, "; "))
	c.Fix = strings.Join(fixes, "; ")
	return c
}

func pinnedK3s() (string, error) {
	p, err := manifests.Pinned()
	if err != nil {
		return "", err
	}
	comp, err := p.Component("k3s")
	if err != nil {
		return "", err
	}
	return comp.Version, nil
}

// LonghornCRD is the CustomResourceDefinition whose presence shows Longhorn's CRDs are installed.
const LonghornCRD = "volumes.longhorn.io"

// Local storage's StorageClass, and the annotation that makes a class the default.
const (
	LocalPathClass    = "local-path"
	defaultClassAnnot = "storageclass.kubernetes.io/is-default-class"
)

// storageFacts is what the API shows of the storage installed.
type storageFacts struct {
	namespace bool // longhorn-system exists
	crds      bool // Longhorn's CRDs exist
	helmKnown bool // the HelmChart CRD exists, so helmChart means something
	helmChart bool // a HelmChart named longhorn exists
	classes   []storageClass
}

type storageClass struct {
	name, provisioner string
	isDefault         bool
}

// readStorageFacts reads them with four requests.
func readStorageFacts(ctx context.Context, c *kube.Clients) (storageFacts, error) {
	var f storageFacts
	_, err := c.Kube.CoreV1().Namespaces().Get(ctx, longhorn.Namespace, metav1.GetOptions{})
	switch {
	case err == nil:
		f.namespace = true
	case !apierrors.IsNotFound(err):
		return f, fmt.Errorf("read namespace %s: %w", longhorn.Namespace, err)
	}
	_, err = c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, LonghornCRD, metav1.GetOptions{})
	switch {
	case err == nil:
		f.crds = true
	case !apierrors.IsNotFound(err):
		return f, fmt.Errorf("read CRD %s: %w", LonghornCRD, err)
	}
	charts, err := c.Dynamic.Resource(components.HelmCharts).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=longhorn"})
	switch {
	case err == nil:
		f.helmKnown, f.helmChart = true, len(charts.Items) > 0
	case !apierrors.IsNotFound(err):
		return f, fmt.Errorf("list HelmCharts: %w", err)
	}
	classes, err := c.Kube.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return f, fmt.Errorf("list storage classes: %w", err)
	}
	for _, sc := range classes.Items {
		f.classes = append(f.classes, storageClass{name: sc.Name, provisioner: sc.Provisioner, isDefault: sc.Annotations[defaultClassAnnot] == "true"})
	}
	return f, nil
}

// longhornInstalled says whether Longhorn is installed (its namespace, or its HelmChart).
func (f storageFacts) longhornInstalled() bool { return f.namespace || f.helmChart }

func (d *doctor) storageCheck(ctx context.Context, v *view) Check {
	f, err := readStorageFacts(ctx, v.c)
	if err != nil {
		return Check{Name: "storage", Status: StatusFail, Detail: err.Error(), Fix: "check that kip's credentials can read namespaces, CRDs and storage classes"}
	}
	return checkStorage(v.rec.Storage, f)
}

// checkStorage judges whether the storage installed is the mode the record names.
func checkStorage(mode string, f storageFacts) Check {
	c := Check{Name: "storage", Status: StatusOK}
	switch mode {
	case cluster.StorageLonghorn:
		var missing []string
		if !f.namespace {
			missing = append(missing, "namespace "+longhorn.Namespace)
		}
		if !f.crds {
			missing = append(missing, "Longhorn's CRDs ("+LonghornCRD+")")
		}
		if f.helmKnown && !f.helmChart {
			missing = append(missing, "HelmChart longhorn")
		}
		if len(missing) > 0 {
			c.Status = StatusFail
			c.Detail = "the cluster record says Longhorn, and Longhorn is not installed: missing " + strings.Join(missing, ", ")
			c.Fix = "run the command that switched the cluster to Longhorn again to finish it: kip cluster storage longhorn (or kip install, on a cluster installed with --storage longhorn)"
			return c
		}
		c.Detail = "Longhorn, as recorded: namespace " + longhorn.Namespace + ", its CRDs"
		if f.helmKnown {
			c.Detail += " and HelmChart"
		}
		c.Detail += " are installed"
	case cluster.StorageLocal:
		var def []string
		var local *storageClass
		for i, sc := range f.classes {
			if sc.isDefault {
				def = append(def, sc.name)
			}
			if sc.name == LocalPathClass {
				local = &f.classes[i]
			}
		}
		switch {
		case local == nil:
			c.Status = StatusFail
			c.Detail = "the cluster record says local storage, and there is no " + LocalPathClass + " StorageClass: new volumes cannot be created"
			c.Fix = "restart k3s on the server (systemctl restart k3s): it deploys local-path from /var/lib/rancher/k3s/server/manifests/local-storage.yaml"
			return c
		case !local.isDefault:
			c.Status = StatusFail
			other := "no class is"
			if len(def) > 0 {
				other = strings.Join(def, ", ") + " is"
			}
			c.Detail = "the cluster record says local storage, and " + LocalPathClass + " is not the default StorageClass (" + other + "): claims without a class do not get local volumes"
			c.Fix = `kubectl patch storageclass local-path -p '{"metadata":{"annotations":{"` + defaultClassAnnot + `":"true"}}}'`
			return c
		case f.longhornInstalled():
			c.Status = StatusWarn
			c.Detail = "the cluster record says local storage, and Longhorn is installed: a switch to Longhorn that did not finish?"
			c.Fix = "run kip cluster storage longhorn again to finish the switch"
			return c
		}
		c.Detail = "local storage, as recorded: " + LocalPathClass + " is the default StorageClass"
	default:
		c.Status, c.Detail = StatusWarn, fmt.Sprintf("the cluster record names an unknown storage mode %q", mode)
		c.Fix = "upgrade kip: a newer kip may have written it"
	}
	return c
}

// longhornDiskChecks warns about each node whose roomiest eligible Longhorn disk is short of room.
func (d *doctor) longhornDiskChecks(ctx context.Context, v *view) []Check {
	nodes, err := v.c.Longhorn.LonghornV1beta2().Nodes(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []Check{{Name: "longhorn disk", Status: StatusWarn, Detail: fmt.Sprintf("list longhorn nodes: %v", err), Fix: "check Longhorn: kubectl -n longhorn-system get pods"}}
	}
	settings, err := longhorn.ReadSettings(ctx, v.c)
	if err != nil {
		return []Check{{Name: "longhorn disk", Status: StatusWarn, Detail: err.Error(), Fix: "check Longhorn: kubectl -n longhorn-system get pods"}}
	}
	var out []Check
	for i := range nodes.Items {
		n := &nodes.Items[i]
		_, roomiest := longhornDisks(n, settings)
		c := Check{Name: "longhorn disk", Node: n.Name, Status: StatusOK}
		if w := longhornLow(roomiest); w != "" {
			c.Status, c.Detail = StatusWarn, w
			c.Fix = "free space on the node's Longhorn disk, grow it, or add a disk to the node in Longhorn"
		} else {
			c.Detail = fmt.Sprintf("the roomiest eligible disk has %s available for scheduling", cli.FormatBytes(roomiest))
		}
		out = append(out, c)
	}
	return out
}

// describe matches git describe's form, v1.2.3-4-gabcdef(-dirty): four commits after v1.2.3.
var describe = regexp.MustCompile(`^(v?\d+\.\d+\.\d+)-(\d+)-g[0-9a-f]+(-dirty)?$`)

// parseKip reads a kip version: a release (v1.2.3) or git describe's form, which is newer than
// its release by its commit count.
func parseKip(s string) (*version.Version, int, error) {
	ahead := 0
	if m := describe.FindStringSubmatch(s); m != nil {
		s = m[1]
		ahead, _ = strconv.Atoi(m[2])
	}
	s = strings.TrimSuffix(s, "-dirty")
	v, err := version.ParseSemantic(s)
	return v, ahead, err
}

// compareKip orders two kip versions; ok is false when either is not a release (a dev build).
func compareKip(a, b string) (cmp int, ok bool) {
	va, na, err := parseKip(a)
	if err != nil {
		return 0, false
	}
	vb, nb, err := parseKip(b)
	if err != nil {
		return 0, false
	}
	switch {
	case va.LessThan(vb):
		return -1, true
	case vb.LessThan(va):
		return 1, true
	case na < nb:
		return -1, true
	case na > nb:
		return 1, true
	}
	return 0, true
}

// checkKipVersion compares this kip with the one the cluster record names.
func checkKipVersion(this, recorded string) Check {
	c := Check{Name: "kip version", Status: StatusOK}
	if recorded == "" {
		c.Detail = "the cluster record names no kip version"
		return c
	}
	cmp, ok := compareKip(this, recorded)
	switch {
	case !ok:
		c.Detail = fmt.Sprintf("this kip is %s and the cluster was installed by kip %s: not comparable (a development build)", this, recorded)
	case cmp < 0:
		c.Status = StatusWarn
		c.Detail = fmt.Sprintf("this kip (%s) is older than kip %s, which last installed or upgraded the cluster", this, recorded)
		c.Fix = fmt.Sprintf("upgrade kip to %s or later", recorded)
	case cmp > 0:
		c.Status = StatusWarn
		c.Detail = fmt.Sprintf("this kip (%s) is newer than kip %s, which last installed or upgraded the cluster: the cluster runs what kip %s installed until it is upgraded", this, recorded, recorded)
		c.Fix = "run 'kip upgrade --check' to see what the upgrade would fix, then 'kip upgrade'"
	default:
		c.Detail = "this kip installed the cluster (" + this + ")"
	}
	return c
}

// operationChecks warns about each unfinished kip operation, with the command that continues it.
func (d *doctor) operationChecks(ctx context.Context, c *kube.Clients) []Check {
	ops, err := workflow.ListUnfinished(ctx, c.Dynamic, kube.ClusterRecords())
	if err != nil {
		return []Check{{Name: "operations", Status: StatusWarn, Detail: err.Error(), Fix: "upgrade kip if a record is newer than this kip"}}
	}
	if len(ops) == 0 {
		return []Check{{Name: "operations", Status: StatusOK, Detail: "no unfinished kip operations"}}
	}
	var out []Check
	for _, p := range ops {
		op := operation(p)
		c := Check{Name: "operation", Status: StatusWarn, Detail: fmt.Sprintf("%s is unfinished: %s", op.Workflow, op.Status)}
		if op.Step != "" {
			c.Detail += " at step " + op.Step
		}
		if op.Error != "" {
			c.Detail += ": " + op.Error
		}
		c.Detail += fmt.Sprintf(" (started %s by %s)", op.StartedAt.UTC().Format(time.RFC3339), op.StartedBy)
		c.Fix = "if no kip runs it now, run the same command again to continue"
		if op.Resume != "" {
			c.Fix += ": " + op.Resume
		}
		out = append(out, c)
	}
	return out
}

// hostChecks runs the checks over SSH on the server and every node, or says why it did not. It
// returns the server's k3s unit when it read one.
func (d *doctor) hostChecks(ctx context.Context, v *view) *Unit {
	targets, unaddressed := d.targets(v)
	const what = "k3s services, certificates, clocks, disks, firewalls, wireguard and the Longhorn OS rule"
	switch {
	case d.o.APIOnly:
		d.add(Check{Name: "host checks", Status: StatusSkipped, Detail: "skipped with --api-only: " + what + " were not checked", Fix: "run kip doctor without --api-only"})
		return nil
	case d.o.Dial == nil:
		d.add(Check{Name: "host checks", Status: StatusSkipped, Detail: "SSH is not set up: " + what + " were not checked", Fix: sshFix})
		return nil
	case len(targets) == 0 && len(unaddressed) == 0:
		d.add(Check{Name: "host checks", Status: StatusSkipped,
			Detail: "no SSH address known for the server (no saved cluster, and no cluster record to read it from): " + what + " were not checked",
			Fix:    sshFix})
		return nil
	}
	var rec cluster.Record
	if v != nil {
		rec = v.rec
	}
	paths := k3sPaths
	diskPaths := []string{cluster.RancherDir}
	if rec.Storage == cluster.StorageLocal {
		diskPaths = append(diskPaths, paths.storage)
	}
	for _, n := range unaddressed {
		d.add(Check{Name: "host checks", Node: n, Status: StatusSkipped,
			Detail: "the node publishes no address to reach it at: " + what + " were not checked there",
			Fix:    "check the node's addresses: kubectl get node " + n + " -o wide"})
	}
	results := inspectHosts(ctx, d.o.Dial, targets, hostRequest{
		facts:    diskPaths,
		probe:    paths.doctorArgs,
		firewall: true,
	})
	var server *Unit
	for _, in := range results {
		d.add(evaluateHost(in, rec, paths, diskPaths, d.now, d.apiDown)...)
		if in.target.server && in.probe != nil && in.probe.unit != nil && server == nil {
			server = in.probe.unit
		}
	}
	return server
}

// explainAPIDown gives the failed api check the fix that what SSH saw of k3s on the server
// calls for.
func (d *doctor) explainAPIDown(u *Unit) {
	for i := range d.checks {
		c := &d.checks[i]
		if c.Name != "api" || c.Status != StatusFail {
			continue
		}
		switch {
		case u.Error != "":
		case !u.installed():
			c.Fix = "k3s is not installed on the server (k3s service below): " + rerunInstall(d.o.Server) + " installs it"
		case u.Running():
			c.Fix = "k3s runs on the server (k3s service below), and its API does not answer here: " + c.Fix
		default:
			c.Fix = "k3s does not run on the server (k3s service below): " + checkUnit(target{addr: d.o.Server, server: true}, u, true).Fix
		}
		return
	}
}

// targets are the hosts to inspect: every node with an address, or the server alone when the
// API gave no nodes. Nodes without an address are returned by name.
func (d *doctor) targets(v *view) (targets []target, unaddressed []string) {
	if v == nil || len(v.nodes) == 0 {
		addr := d.o.Server
		if v != nil {
			addr = v.serverAddr(d.o)
		}
		if addr == "" {
			return nil, nil
		}
		return []target{{addr: addr, server: true}}, nil
	}
	for i := range v.nodes {
		n := &v.nodes[i]
		addr := v.sshAddr(d.o, n)
		if addr == "" {
			unaddressed = append(unaddressed, n.Name)
			continue
		}
		targets = append(targets, target{node: n.Name, addr: addr, server: cluster.NodeRole(n) == cluster.RoleServer})
	}
	return targets, unaddressed
}

// evaluateHost turns what one host showed into checks. apiDown says the API did not answer.
func evaluateHost(in inspection, rec cluster.Record, paths hostPaths, diskPaths []string, now time.Time, apiDown bool) []Check {
	t := in.target
	node := t.node
	if node == "" {
		node = t.addr
	}
	if in.dialErr != nil {
		const notRun = "its host checks (k3s service, certificates, clock, disk, firewall, wireguard, Longhorn OS) were not run"
		if forget, ok := sshx.HostKeyChanged(in.dialErr); ok {
			return []Check{{Name: "ssh", Node: node, Status: StatusFail,
				Detail: fmt.Sprintf("kip refused %s: %v; %s", t.label(), in.dialErr, notRun),
				Fix:    hostKeyFix(forget)}}
		}
		return []Check{{Name: "ssh", Node: node, Status: StatusWarn,
			Detail: fmt.Sprintf("cannot reach %s over SSH: %v; %s", t.label(), in.dialErr, notRun),
			Fix:    sshFix + "; and check that " + t.addr + " accepts SSH from this machine"}}
	}
	var out []Check
	if in.factsErr != nil {
		out = append(out, Check{Name: "host facts", Node: node, Status: StatusWarn, Detail: in.factsErr.Error(), Fix: "check that the SSH user can run sh, uname and df on the node"})
	} else {
		if rec.Storage == cluster.StorageLonghorn {
			out = append(out, checkLonghornOS(node, in.facts))
		}
		out = append(out, checkWireGuard(node, in.facts.Modules["wireguard"], rec.Network))
		out = append(out, checkHostDisk(node, in.facts.Disks, diskPaths))
	}
	if in.fwErr != nil {
		out = append(out, Check{Name: "firewall", Node: node, Status: StatusWarn, Detail: "cannot read the host firewall: " + in.fwErr.Error(), Fix: "check ufw or firewalld on the node"})
	} else {
		out = append(out, checkFirewall(node, t.addr, in.fw, t.server, in.sshPort))
	}
	if in.probeErr != nil {
		out = append(out, Check{Name: "certificates", Node: node, Status: StatusWarn, Detail: "cannot read the node's certificates and clock: " + in.probeErr.Error(), Fix: "check that the SSH user can read " + paths.agent + " (as root, or with sudo)"})
		return out
	}
	ct := t
	ct.node = node
	if in.probe.unit != nil {
		out = append(out, checkUnit(ct, in.probe.unit, apiDown))
	}
	out = append(out, checkCerts(ct, paths.serverTLS, in.probe.certs, now))
	if in.probe.hasClock {
		skew, uncertainty := in.probe.clockSkew()
		out = append(out, checkClock(node, node+"'s", skew, uncertainty))
	}
	return out
}

// WriteText writes the checks as glyph lines with their fixes, and a summary.
func (d *Diagnosis) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	for _, c := range d.Checks {
		glyph := map[CheckStatus]string{StatusOK: cli.GlyphOK, StatusWarn: cli.GlyphWarn, StatusFail: cli.GlyphFail, StatusSkipped: glyphSkipped}[c.Status]
		fmt.Fprintf(b, "%s %s: %s\n", glyph, c.title(), c.Detail)
		if len(c.Log) > 0 {
			fmt.Fprintf(b, "    last %d lines of its journal:\n", len(c.Log))
			for _, l := range c.Log {
				fmt.Fprintf(b, "      %s\n", l)
			}
		}
		switch {
		case c.Fix == "":
		case c.Status == StatusSkipped:
			fmt.Fprintf(b, "    to run them: %s\n", c.Fix)
		default:
			fmt.Fprintf(b, "    fix: %s\n", c.Fix)
		}
	}
	s := d.Summary
	fmt.Fprintf(b, "\n%d failed, %d %s, %d passed, %d skipped\n", s.Fail, s.Warn, plural(s.Warn, "warning"), s.OK, s.Skipped)
	_, err := io.WriteString(w, b.String())
	return err
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
