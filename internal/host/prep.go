package host

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"kipper.run/kip/internal/sshx"
)

//go:embed prep.sh
var prepScript string

// The files kip writes on a host. Each holds exactly what kip renders; the checks compare them
// whole.
const (
	modulesFile   = "/etc/modules-load.d/kipper.conf"
	sysctlFile    = "/etc/sysctl.d/90-kipper.conf" // before 99-*.conf: the operator's own files win
	journaldFile  = "/etc/systemd/journald.conf.d/90-kipper.conf"
	multipathFile = "/etc/multipath/conf.d/kipper.conf"
)

// prep runs a subcommand of prep.sh on the host, one round trip, and returns its sections. Its
// show only reads the host (sshx.Client.Query); the others change it.
func prep(ctx context.Context, c *sshx.Client, args ...string) (map[string]string, error) {
	run := c.Output
	if args[0] == "show" {
		run = c.Query
	}
	out, err := run(ctx, sshx.Command("sh", append([]string{"-c", prepScript, "kip-prep"}, args...)...))
	if err != nil {
		return nil, err
	}
	if !strings.Contains(string(out), "\n@@kip-prep ") {
		return map[string]string{}, nil
	}
	s, err := sshx.Sections(string(out), "@@kip-prep", nil)
	if err != nil {
		return nil, fmt.Errorf("read the output of prep.sh %s: %w", args[0], err)
	}
	return s, nil
}

// filesHold reports whether each of the files holds exactly its content, in one round trip.
func filesHold(ctx context.Context, c *sshx.Client, files map[string]string) (bool, error) {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	s, err := prep(ctx, c, append([]string{"show"}, paths...)...)
	if err != nil {
		return false, err
	}
	for p, want := range files {
		if got, ok := s["file "+p]; !ok || got != want {
			return false, nil
		}
	}
	return true, nil
}

// Modules returns the kernel modules the host needs loaded: br_netfilter and overlay for k3s
// (bridged pod traffic through iptables; containerd's overlayfs snapshotter), wireguard for the
// WireGuard pod network, and for Longhorn iscsi_tcp (volumes attach over iSCSI) and nfs (shared
// volumes and backups). Not dm_crypt: Longhorn needs it only for encrypted volumes, which Kipper
// does not create.
func Modules(longhorn, wireGuard bool) []string {
	mods := []string{"br_netfilter", "overlay"}
	if wireGuard {
		mods = append(mods, "wireguard")
	}
	if longhorn {
		mods = append(mods, "iscsi_tcp", "nfs")
	}
	return mods
}

func modulesContent(mods []string) string {
	return "# Kernel modules loaded at boot for k3s, and for WireGuard and Longhorn when used.\n" +
		"# Written by kip, which rewrites it: see docs/host.md.\n" + strings.Join(mods, "\n") + "\n"
}

// ModulesInPlace reports whether /etc/modules-load.d/kipper.conf lists exactly mods, so that
// they load at every boot. LoadModules writes it only once they all loaded.
func ModulesInPlace(ctx context.Context, c *sshx.Client, mods []string) (bool, error) {
	ok, err := filesHold(ctx, c, map[string]string{modulesFile: modulesContent(mods)})
	if err != nil {
		return false, fmt.Errorf("check the kernel modules: %w", err)
	}
	return ok, nil
}

var moduleName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// LoadModules loads mods now (a module already loaded, or built in, needs nothing) and, once
// all loaded, writes /etc/modules-load.d/kipper.conf so that they load at every boot. The error
// names each module that could not load, what modprobe said, and the fix for the host's os. One
// round trip.
func LoadModules(ctx context.Context, c *sshx.Client, os sshx.OS, mods []string) error {
	for _, m := range mods {
		if !moduleName.MatchString(m) {
			return fmt.Errorf("load kernel modules: %q is not a module name", m)
		}
	}
	s, err := prep(ctx, c, append([]string{"modules", modulesFile, modulesContent(mods)}, mods...)...)
	if err != nil {
		return fmt.Errorf("load kernel modules: %w", err)
	}
	return loadError(c.Host(), os, mods, s)
}

// loadError returns the error for the modules prep.sh modules could not load, or nil.
func loadError(host string, os sshx.OS, mods []string, s map[string]string) error {
	kernel := strings.TrimSpace(s["kernel"])
	var failed, fixes []string
	for _, m := range mods {
		out, ok := s["failed "+m]
		if !ok {
			continue
		}
		failed = append(failed, fmt.Sprintf("%s (%s)", m, strings.Join(sshx.Lines(out), "; ")))
		if fix := moduleFix(m, os, kernel); !slices.Contains(fixes, fix) {
			fixes = append(fixes, fix)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("load kernel modules on %s: %d cannot load: %s; fix: %s",
		host, len(failed), strings.Join(failed, ", "), strings.Join(fixes, "; "))
}

// moduleFix says how to get module m on a host running kernel on os.
func moduleFix(m string, os sshx.OS, kernel string) string {
	switch m {
	case "wireguard":
		return "boot a kernel with the wireguard module (Linux 5.6 or later has it)"
	case "iscsi_tcp", "nfs":
		if cmd := ExtraModulesCommand(os, kernel); cmd != "" {
			return fmt.Sprintf("install the kernel modules package for kernel %s (%s), or boot a kernel that has %s", kernel, cmd, m)
		}
	}
	return fmt.Sprintf("boot a kernel that has the %s module", m)
}

// sysctl is a kernel setting kip makes on a fresh install.
type sysctl struct {
	key, value string
	atLeast    bool   // a host with a larger value keeps it
	why        string // the comment above it in the file
}

// sysctls are what k3s and its workloads need. k3s sets the first three itself when it starts;
// the file makes them hold from boot, before k3s, and across a firewall's own settings. The
// inotify limits are for kubelet, containerd and the log collectors, which watch many files.
// No IPv6 forwarding: it would stop the host from taking router advertisements, which some
// providers' IPv6 depends on, and kip's pod network is IPv4.
var sysctls = []sysctl{
	{"net.ipv4.ip_forward", "1", false, "k3s routes pod and service traffic through the host."},
	{"net.bridge.bridge-nf-call-iptables", "1", false, "Traffic between pods on a bridge passes iptables, where kube-proxy and network policies act (needs br_netfilter)."},
	{"net.bridge.bridge-nf-call-ip6tables", "1", false, "The same for IPv6."},
	{"fs.inotify.max_user_instances", "8192", true, "kubelet, containerd and log collectors each watch files: the default of 128 runs out."},
	{"fs.inotify.max_user_watches", "1048576", true, "The largest default the kernel picks by itself, so that no host gets fewer than it had."},
}

func sysctlContent() string {
	var b strings.Builder
	b.WriteString("# Kernel settings for k3s and its workloads, written by kip on install: see docs/host.md.\n" +
		"# Put settings of your own in a later file, such as 99-local.conf: it wins.\n")
	for _, s := range sysctls {
		fmt.Fprintf(&b, "\n# %s\n%s = %s\n", s.why, s.key, s.value)
	}
	return b.String()
}

// SysctlsInPlace reports whether /etc/sysctl.d/90-kipper.conf holds kip's settings and the
// kernel has them (an inotify limit that is higher counts). A key whose /proc/sys file is
// read-only is not checked: the host is a container (systemd-nspawn, LXC) and the key belongs
// to the kernel of the machine that runs it, which the host cannot change. One round trip.
func SysctlsInPlace(ctx context.Context, c *sshx.Client) (bool, error) {
	args := []string{"show", sysctlFile, "--"}
	for _, s := range sysctls {
		args = append(args, s.key)
	}
	sec, err := prep(ctx, c, args...)
	if err != nil {
		return false, fmt.Errorf("check the sysctls: %w", err)
	}
	return sysctlsHold(sec), nil
}

// sysctlsHold decides SysctlsInPlace on what prep.sh show found.
func sysctlsHold(sec map[string]string) bool {
	if f, ok := sec["file "+sysctlFile]; !ok || f != sysctlContent() {
		return false
	}
	for _, s := range sysctls {
		access, value, _ := strings.Cut(strings.TrimSpace(sec["sysctl "+s.key]), " ")
		switch access {
		case "readonly":
		case "writable":
			if !s.holds(value) {
				return false
			}
		default: // missing
			return false
		}
	}
	return true
}

func (s sysctl) holds(value string) bool {
	if value == s.value {
		return true
	}
	have, err1 := strconv.ParseInt(value, 10, 64)
	want, err2 := strconv.ParseInt(s.value, 10, 64)
	return s.atLeast && err1 == nil && err2 == nil && have >= want
}

// ApplySysctls writes /etc/sysctl.d/90-kipper.conf, so that the settings hold from every boot,
// and sets each key the kernel does not have yet (raising, never lowering, the inotify limits).
// Keys whose /proc/sys file is read-only are left as they are, as SysctlsInPlace says; kip install
// calls it on a fresh install only. It fails when a key does not exist: the bridge keys need
// br_netfilter, which LoadModules loads. One round trip.
func ApplySysctls(ctx context.Context, c *sshx.Client) error {
	args := []string{"sysctls", sysctlFile, sysctlContent()}
	for _, s := range sysctls {
		mode := "exact"
		if s.atLeast {
			mode = "atleast"
		}
		args = append(args, s.key, s.value, mode)
	}
	sec, err := prep(ctx, c, args...)
	if err != nil {
		return fmt.Errorf("set the sysctls: %w", err)
	}
	var missing []string
	for _, s := range sysctls {
		if _, ok := sec["missing "+s.key]; ok {
			missing = append(missing, s.key)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("set the sysctls on %s: the kernel has no %s; load the kernel modules first (br_netfilter makes net.bridge.*)",
			c.Host(), strings.Join(missing, ", "))
	}
	return nil
}

// hardeningFile is a configuration file of the service hardening and the service that reads it
// (prep.sh hardening has the service read it again when it changed).
type hardeningFile struct {
	service, path, content string
}

// journaldContent caps the journal. journald's own cap is 10% of the file system, up to 4 GiB;
// k3s logs to the journal, and on a small server images and volumes share that disk. 1 GiB
// keeps weeks of logs; pods' logs go to Loki where monitoring runs.
const journaldContent = "# Written by kip (service hardening): see docs/host.md.\n[Journal]\nSystemMaxUse=1G\n"

// multipathContent keeps multipathd off Longhorn's volumes. Longhorn attaches each volume as a
// local iSCSI disk (vendor IET, product VIRTUAL-DISK); a multipathd that claims one makes the
// volume's mount fail ("already mounted or mount point busy"). Longhorn's knowledge base
// blacklists every sd* device, which would also take an operator's real multipath disks away;
// this blacklists Longhorn's disks only. multipathd reads /etc/multipath/conf.d; the file is
// written whether multipath-tools is installed or not, so that a later install finds it.
const multipathContent = "# Written by kip (service hardening): keep multipathd off Longhorn's volumes. See docs/host.md.\n" +
	"blacklist {\n\tdevice {\n\t\tvendor \"IET\"\n\t\tproduct \"VIRTUAL-DISK\"\n\t}\n}\n"

// hardeningFiles is the service hardening: a journal size cap, and on Longhorn hosts the
// multipath blacklist. It never touches sshd's configuration: a mistake there locks the
// operator out, and the host firewall is what limits who reaches SSH.
func hardeningFiles(longhorn bool) []hardeningFile {
	files := []hardeningFile{{"journald", journaldFile, journaldContent}}
	if longhorn {
		files = append(files, hardeningFile{"multipath", multipathFile, multipathContent})
	}
	return files
}

// HardeningInPlace reports whether the service hardening's files hold kip's settings (see
// hardeningFiles). One round trip.
func HardeningInPlace(ctx context.Context, c *sshx.Client, longhorn bool) (bool, error) {
	want := map[string]string{}
	for _, f := range hardeningFiles(longhorn) {
		want[f.path] = f.content
	}
	ok, err := filesHold(ctx, c, want)
	if err != nil {
		return false, fmt.Errorf("check the service hardening: %w", err)
	}
	return ok, nil
}

// ApplyHardening writes the service hardening's files and has each service read its file
// again: journald restarts (it keeps the services' log streams), a running multipathd
// reconfigures. One round trip.
func ApplyHardening(ctx context.Context, c *sshx.Client, longhorn bool) error {
	args := []string{"hardening"}
	for _, f := range hardeningFiles(longhorn) {
		args = append(args, f.service, f.path, f.content)
	}
	if _, err := prep(ctx, c, args...); err != nil {
		return fmt.Errorf("apply the service hardening: %w", err)
	}
	return nil
}
