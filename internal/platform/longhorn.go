package platform

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/install"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// LonghornOptions are kip cluster storage longhorn's.
type LonghornOptions struct {
	Options
	// Dial connects to a host over SSH with the cluster's settings; Server is the server's SSH
	// address as saved for the cluster ("" falls back to the record's).
	Dial   func(ctx context.Context, host string) (*sshx.Client, error)
	Server string
}

// longhornWorkflow names the switch's progress record.
const longhornWorkflow = "cluster-storage-longhorn"

// settingsTimeout bounds the wait for Longhorn to store the pinned settings.
const settingsTimeout = 2 * time.Minute

// SwitchToLonghorn is kip cluster storage longhorn: a cluster on local storage gets Longhorn in
// place. Nothing stops: the host gets Longhorn's packages and kernel modules, Longhorn is
// installed with kip's pinned settings and the one-copy class, and the record's storage mode
// becomes longhorn. The platform's own volumes (registry, Loki) and every service volume stay
// where they are; the command ends with the command that moves each service.
func SwitchToLonghorn(ctx context.Context, o *LonghornOptions) error {
	pl, err := loadPlatform(ctx, o.Options)
	if err != nil {
		return err
	}
	p, err := workflow.Unfinished(ctx, pl.cl.Dynamic, kube.ClusterRecords(), longhornWorkflow, nil)
	if err != nil {
		return err
	}
	resumed := p != nil
	if pl.rec.Storage == cluster.StorageLonghorn && !resumed {
		pl.p.StepAlready("The cluster's storage is already Longhorn")
		return pl.listLocalServices(ctx)
	}
	if !resumed && pl.rec.KipVersion != pl.o.KipVersion {
		return fmt.Errorf("the platform was installed or last upgraded by kip %s and this is kip %s: the move relies on admission policies this kip installs, "+
			"so bring the platform up to date first by running 'kip upgrade' with this kip ('kip upgrade --check' says what it would fix)",
			pl.rec.KipVersion, pl.o.KipVersion)
	}
	addr, err := pl.rec.ServerHost(o.Server)
	if err != nil {
		return err
	}
	c, err := o.Dial(ctx, addr)
	if err != nil {
		return fmt.Errorf("connect to the server %s: %w", addr, err)
	}
	facts, err := c.Facts(ctx, cluster.LonghornDir)
	if err != nil {
		return fmt.Errorf("read the server's facts: %w", err)
	}
	family, err := host.Identify(facts.OS)
	if err != nil {
		return err
	}
	if !resumed {
		if err := pl.checkLonghorn(ctx, c, facts); err != nil {
			return err
		}
	}
	comps, err := pl.longhornComponents(ctx)
	if err != nil {
		return err
	}
	var lh *components.Component
	for i := range comps {
		if comps[i].Name == "longhorn" {
			lh = &comps[i]
		}
	}
	if lh == nil {
		return fmt.Errorf("the components rendered for Longhorn storage have no longhorn")
	}
	pkgs := family.LonghornPackages
	mods := host.Modules(true, pl.rec.Network == cluster.NetworkWireGuard)
	steps := []workflow.Step{
		{Name: "host-packages", Title: "Install Longhorn's host packages (" + strings.Join(pkgs, ", ") + ")",
			Done: "Installed Longhorn's host packages", Already: "Longhorn's host packages already installed",
			Check: func(ctx context.Context) (bool, error) {
				missing, err := family.MissingPackages(ctx, c, pkgs)
				return len(missing) == 0, err
			},
			Apply: func(ctx context.Context) error { return family.InstallPackages(ctx, c, pkgs) }},
		{Name: "host-modules", Title: "Load kernel modules (" + strings.Join(mods, ", ") + ")",
			Done: "Loaded kernel modules", Already: "Kernel modules already set up",
			Check: func(ctx context.Context) (bool, error) { return host.ModulesInPlace(ctx, c, mods) },
			Apply: func(ctx context.Context) error { return host.LoadModules(ctx, c, facts.OS, mods) }},
		{Name: "host-hardening", Title: "Apply Longhorn's service hardening",
			Done: "Applied Longhorn's service hardening", Already: "Longhorn's service hardening already applied",
			Check: func(ctx context.Context) (bool, error) { return host.HardeningInPlace(ctx, c, true) },
			Apply: func(ctx context.Context) error { return host.ApplyHardening(ctx, c, true) }},
		components.Step(pl.cl, *lh),
		{Name: "longhorn-settings", Title: "Check Longhorn's pinned settings", Done: "Longhorn's pinned settings hold",
			Already: "Longhorn's pinned settings hold",
			Check: func(ctx context.Context) (bool, error) {
				pending, err := components.PinnedSettingsPending(ctx, pl.cl)
				return err == nil && pending == "", err
			},
			Apply: func(ctx context.Context) error {
				if err := components.Apply(ctx, pl.cl, *lh); err != nil {
					return err
				}
				return kube.PollPending(ctx, settingsTimeout, "Longhorn's pinned settings", func(ctx context.Context) (string, error) {
					return components.PinnedSettingsPending(ctx, pl.cl)
				})
			}},
		longhorn.PlacementStep(pl.cl),
	}
	if err := pl.run(ctx, longhornWorkflow, steps, func(r *cluster.Record) {
		r.Storage = cluster.StorageLonghorn
		r.Versions = maps.Clone(r.Versions)
		if r.Versions == nil {
			r.Versions = map[string]string{}
		}
		r.Versions[lh.Name] = lh.Version
	}); err != nil {
		return err
	}
	pl.p.Success("The cluster's storage is Longhorn: new volumes get one Longhorn copy, kip node add accepts workers, and shared (ReadWriteMany) volumes work. " +
		"The registry and Loki keep their volumes on the server's local storage.")
	return pl.listLocalServices(ctx)
}

// longhornComponents renders the cluster's components with Longhorn storage and its backup mode
// kept (a cluster without backups stays without).
func (pl *platform) longhornComponents(ctx context.Context) ([]components.Component, error) {
	p, err := cluster.ProfileNamed(pl.rec.Profile)
	if err != nil {
		return nil, err
	}
	return pl.components(ctx, p, pl.rec.Monitoring, cluster.StorageLonghorn)
}

// checkLonghorn refuses, naming the fix, a host or cluster that cannot take Longhorn (spec 000,
// "Check the requirements"): too little RAM, an OS Longhorn refuses, a node without Longhorn's
// CPU free, or a disk without room for its reserve and a second copy of every service volume.
func (pl *platform) checkLonghorn(ctx context.Context, c *sshx.Client, facts *sshx.Facts) error {
	if facts.MemTotalMiB < cluster.LonghornMinMemoryMiB {
		return fmt.Errorf("the server has %d MiB of RAM and Longhorn needs at least %d MiB: resize the server first (the cluster keeps its %s profile; kip platform profile set changes it)",
			facts.MemTotalMiB, cluster.LonghornMinMemoryMiB, pl.rec.Profile)
	}
	if err := host.CheckLonghorn(facts.OS, facts.Kernel); err != nil {
		return fmt.Errorf("%w: %s", err, host.LonghornOSFix)
	}
	if err := pl.checkCPU(ctx); err != nil {
		return err
	}
	return pl.checkDisk(ctx, c, facts)
}

// checkCPU refuses a node without Longhorn's CPU free.
func (pl *platform) checkCPU(ctx context.Context) error {
	nodes, err := pl.cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	pods, err := pl.cl.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	services, err := service.CPUByNode(ctx, pl.cl, pods.Items)
	if err != nil {
		return err
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if err := longhorn.CheckCPU(n, pods.Items, services[n.Name]); err != nil {
			return err
		}
	}
	return nil
}

// checkDisk refuses when the file system holding /var/lib/longhorn would not keep Longhorn's
// reserve free once it also holds a second copy of every service volume (each local copy stays
// until prune).
func (pl *platform) checkDisk(ctx context.Context, c *sshx.Client, facts *sshx.Facts) error {
	d, ok := facts.Disks[cluster.LonghornDir]
	if !ok {
		return fmt.Errorf("cannot see the free space of the file system holding %s: check that df works on the server", cluster.LonghornDir)
	}
	paths, err := pl.serviceVolumeDirs(ctx)
	if err != nil {
		return err
	}
	var data uint64
	if len(paths) > 0 {
		out, err := c.Output(ctx, sshx.Command("du", append([]string{"-s", "-B1", "--"}, paths...)...))
		if err != nil {
			return fmt.Errorf("measure the service volumes on the server: %w", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			n, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return fmt.Errorf("measure the service volumes on the server: %q: %w", line, err)
			}
			data += n
		}
	}
	reserve := d.TotalBytes / 100 * install.LonghornReservedPercent
	if d.FreeBytes < data || d.FreeBytes-data <= reserve {
		return fmt.Errorf("%s has %s free of %s; Longhorn keeps more than %d%% (%s) free, and a second copy of every service volume needs %s more (the local copies stay until 'kip cluster storage prune'): add disk space to %s first",
			d.Mount, gibText(d.FreeBytes), gibText(d.TotalBytes), install.LonghornReservedPercent, gibText(reserve), gibText(data), d.Mount)
	}
	return nil
}

func gibText(n uint64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// localService is a service whose data is still on local storage.
type localService struct {
	ref  service.Ref
	pv   *corev1.PersistentVolume
	path string
}

// localServices lists the services whose data claim is on a local volume, sorted.
func (pl *platform) localServices(ctx context.Context) ([]localService, error) {
	svcs, err := service.List(ctx, pl.cl.Dynamic, pl.cl.Kube)
	if err != nil {
		return nil, err
	}
	var out []localService
	for _, svc := range svcs {
		ref := svc.Ref
		claim, err := pl.cl.Kube.CoreV1().PersistentVolumeClaims(svc.Namespace()).Get(ctx, svc.DataClaim(), metav1.GetOptions{})
		if err != nil || claim.Spec.VolumeName == "" {
			continue
		}
		pv, err := pl.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			continue
		}
		switch {
		case pv.Spec.HostPath != nil:
			out = append(out, localService{ref, pv, pv.Spec.HostPath.Path})
		case pv.Spec.Local != nil:
			out = append(out, localService{ref, pv, pv.Spec.Local.Path})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ref.String() < out[j].ref.String() })
	return out, nil
}

func (pl *platform) serviceVolumeDirs(ctx context.Context) ([]string, error) {
	svcs, err := pl.localServices(ctx)
	var paths []string
	for _, s := range svcs {
		paths = append(paths, s.path)
	}
	return paths, err
}

// listLocalServices ends the switch: each service volume still local, with the command that
// moves it.
func (pl *platform) listLocalServices(ctx context.Context) error {
	svcs, err := pl.localServices(ctx)
	if err != nil {
		return err
	}
	if len(svcs) == 0 {
		pl.p.Info("No service keeps its data on local storage.")
		return nil
	}
	pl.p.Info(fmt.Sprintf("%d service volume(s) are still on local storage; move each when it suits you (the service stops while its data moves):", len(svcs)))
	// Without backups a move needs --no-backup; with them, a completed backup of the project.
	flag, note := " --no-backup", "without backups nothing could restore a service whose move went wrong: each command passes --no-backup"
	if pl.rec.Backups != cluster.BackupsNone {
		flag, note = "", "a move needs a completed backup of the service's project first: kip backup create --project P --wait"
	}
	for _, s := range svcs {
		pl.p.Info(fmt.Sprintf("  %s (%s): kip service storage longhorn %s%s", s.ref, service.Where(s.pv), s.ref.Flags(), flag))
	}
	pl.p.Info("(" + note + ")")
	return nil
}
