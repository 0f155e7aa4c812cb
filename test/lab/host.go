package lab

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"kipper.run/kip/internal/sshx"
)

//go:embed boot.sh
var bootScript string

const (
	// netnsPrefix names a host's network namespace: kip-lab1.
	netnsPrefix = "kip-"
	// bootMarker starts the name ($0) of the script that runs a host: kip-lab-boot-lab1.
	bootMarker = "kip-lab-boot-"
	// Where a host with a given memory size finds its /proc/meminfo: nspawn resolves the source
	// of a bind mount onto /proc inside the container.
	meminfoPath = "/etc/kip-lab/meminfo"
	// longhornPath is where a host with a Longhorn disk has it, Longhorn's default data path.
	longhornPath = "/var/lib/longhorn"
	// sysBlock lists this machine's block devices, a bound loop device with its backing file.
	sysBlock = "/sys/block"
	// containerdPath is where k3s's containerd keeps images and snapshots.
	containerdPath = "/var/lib/rancher/k3s/agent/containerd"
	// tunablesDir holds the host's answers for kubeletTunables, resolved inside the host as the
	// meminfo file is.
	tunablesDir = "/etc/kip-lab/sysctl"
)

// kubeletTunables are the kernel settings a kubelet sets when it starts, and fails to start
// without (kubelet's setupKernelTunables). They belong to this machine's kernel, which a host
// may not change: each host sees them set as a kubelet would set them, in files bound over
// /proc/sys.
var kubeletTunables = []struct{ key, value string }{
	{"vm/overcommit_memory", "1"},
	{"vm/panic_on_oom", "0"},
	{"kernel/panic", "10"},
	{"kernel/panic_on_oops", "1"},
	{"kernel/keys/root_maxkeys", "1000000"},
	{"kernel/keys/root_maxbytes", "25000000"},
}

// Host is a lab host: a Debian bookworm booted by systemd, reachable as root with KeyPath.
type Host struct {
	Name      string     // lab1, lab2, …; also its host name
	PrivateIP netip.Addr // eth0, on the private bridge
	PublicIP  netip.Addr // eth1, on the public bridge, which has the default route
	KeyPath   string     // the root login's private key
	MemoryMiB int        // MemTotal it shows; 0: this machine's
	CPUs      int        // the count nproc prints; 0: this machine's
	Modules   []string   // kernel modules modprobe pretends to load (HostOptions.Modules)
	// LonghornDiskGiB is the size of the file system at /var/lib/longhorn; 0: none of its own.
	LonghornDiskGiB int

	lab    *Lab
	mu     sync.Mutex
	client *sshx.Client // Run's connection
}

func (l *Lab) newHost(hs hostState) *Host {
	return &Host{
		Name:            hs.Name,
		PrivateIP:       netip.AddrFrom4([4]byte{10, 77, 0, byte(10 + hs.Index)}),
		PublicIP:        netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + hs.Index)}),
		KeyPath:         filepath.Join(stateDir, hs.Name, "id_ed25519"),
		MemoryMiB:       hs.MemoryMiB,
		CPUs:            hs.CPUs,
		Modules:         hs.Modules,
		LonghornDiskGiB: hs.LonghornDiskGiB,
		lab:             l,
	}
}

// Paths of a host: its records in the state directory, its disk in the disk directory.
func (h *Host) dir() string     { return filepath.Join(stateDir, h.Name) }
func (h *Host) pidPath() string { return filepath.Join(h.dir(), "boot.pid") }
func (h *Host) logPath() string { return filepath.Join(h.dir(), "console.log") }
func (h *Host) root() string    { return filepath.Join(diskDir, h.Name, "root") }
func (h *Host) netns() string   { return netnsPrefix + h.Name }

// The host's Longhorn disk: a sparse image beside its overlay, and where this machine mounts it.
func (h *Host) longhornImage() string { return filepath.Join(diskDir, h.Name, "longhorn.img") }
func (h *Host) longhornMount() string { return filepath.Join(diskDir, h.Name, "longhorn") }

// containerdDir is the host's containerd directory, on this machine's file system beside the
// host's overlay.
func (h *Host) containerdDir() string { return filepath.Join(diskDir, h.Name, "containerd") }

// veth returns the name of the root namespace's end of the host's link to a network.
func (h *Host) veth(network string) string { return hostVeth(h.Name, network) }

func hostVeth(name, network string) string {
	if network == "private" {
		return netnsPrefix + name + "-priv"
	}
	return netnsPrefix + name + "-pub"
}

// create makes the host's disk, files, key and network namespace; all lists every host of the lab.
func (h *Host) create(ctx context.Context, all []hostState, m mirrors) error {
	disk := filepath.Dir(h.root())
	for _, d := range []string{h.dir(), h.root(), filepath.Join(disk, "upper"), filepath.Join(disk, "work"), h.containerdDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", h.lab.st.Image, disk, disk)
	if err := syscall.Mount("overlay", h.root(), "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount the disk: %w", err)
	}
	pub, err := writeKey(h.KeyPath)
	if err != nil {
		return err
	}
	files, err := h.files(all, m, pub)
	if err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(h.root(), f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(h.root(), "root/.ssh"), 0o700); err != nil {
		return err
	}
	if h.LonghornDiskGiB > 0 {
		if err := h.createLonghornDisk(ctx); err != nil {
			return err
		}
	}
	return h.createNet(ctx)
}

// createLonghornDisk makes the host's Longhorn disk: an ext4 file system of LonghornDiskGiB GiB
// on a sparse image, loop-mounted on this machine for boot to bind into the host. mke2fs
// discards the image (punches holes) before writing its metadata, so the journal reads as
// zeroes without being written (lazy_journal_init): the image takes a few MiB until the host
// writes to it.
func (h *Host) createLonghornDisk(ctx context.Context) error {
	img, mnt := h.longhornImage(), h.longhornMount()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return err
	}
	if err := os.Truncate(img, int64(h.LonghornDiskGiB)<<30); err != nil {
		return err
	}
	if err := run(ctx, "mkfs.ext4", "-q", "-F", "-E", "lazy_journal_init=1", img); err != nil {
		return err
	}
	return run(ctx, "mount", "-t", "ext4", "-o", "loop", img, mnt)
}

type file struct {
	path string // in the host
	data string
	mode fs.FileMode
}

// files returns what the host needs on its disk before it boots.
func (h *Host) files(all []hostState, m mirrors, key ssh.PublicKey) ([]file, error) {
	id := make([]byte, 16)
	rand.Read(id)
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	for _, hs := range all {
		hosts += fmt.Sprintf("%s\t%s\n", h.lab.newHost(hs).PrivateIP, hs.Name)
	}
	sources := fmt.Sprintf("deb %s bookworm main\ndeb %s bookworm-updates main\n", m.Archive, m.Archive)
	if m.Security != "" {
		sources += fmt.Sprintf("deb %s bookworm-security main\n", m.Security)
	}
	files := []file{
		{"etc/hostname", h.Name + "\n", 0o644},
		{"etc/hosts", hosts, 0o644},
		{"etc/machine-id", hex.EncodeToString(id) + "\n", 0o444},
		{"root/.ssh/authorized_keys", string(ssh.MarshalAuthorizedKey(key)), 0o600},
		{"etc/apt/sources.list", sources, 0o644},
		{"etc/apt/apt.conf.d/01kip-proxy", fmt.Sprintf("Acquire::http::Proxy %q;\n", AptProxy), 0o644},
		// nspawn gives the host no /dev/kmsg, which the kubelet's OOM watcher reads; the console
		// stands in for it, as in other container-hosted nodes (kind).
		{"etc/tmpfiles.d/kip-lab-kmsg.conf", "L /dev/kmsg - - - - /dev/console\n", 0o644},
	}
	for _, t := range kubeletTunables {
		files = append(files, file{tunablesDir + "/" + t.key, t.value + "\n", 0o444})
	}
	if h.MemoryMiB > 0 {
		mi, err := meminfo(h.MemoryMiB)
		if err != nil {
			return nil, err
		}
		files = append(files, file{meminfoPath, mi, 0o444})
	}
	if cpus, err := machineCPUs(); err != nil {
		return nil, err
	} else if h.CPUs > len(cpus) {
		// More CPUs than this machine has: nproc (first on root's PATH) says so; programs that
		// ask the kernel (sched_getaffinity) still see this machine's.
		files = append(files, file{"usr/local/bin/nproc", fmt.Sprintf("#!/bin/sh\n# kip lab: this host has %d CPUs.\necho %d\n", h.CPUs, h.CPUs), 0o755})
	}
	if len(h.Modules) > 0 {
		files = append(files, file{"usr/local/sbin/modprobe", modprobeShim(h.Modules), 0o755})
	}
	return files, nil
}

// modprobeShim returns a modprobe that succeeds, loading nothing, for `modprobe [-n] [-q] [-v] M`
// with M one of mods (dashes and underscores alike, as modprobe takes them), and runs the real
// modprobe for anything else. It comes first on root's PATH (/usr/local/sbin), over SSH and sudo.
func modprobeShim(mods []string) string {
	return `#!/bin/sh
# kip lab: this machine's kernel loads no modules; this host pretends it can load these.
set -eu
pretend=" ` + strings.ReplaceAll(strings.Join(mods, " "), "-", "_") + ` "
name=
for a in "$@"; do
	case $a in
	-n | -q | -v | -nq | -qn | --dry-run | --quiet | --verbose) ;;
	-*) exec /usr/sbin/modprobe "$@" ;;
	*)
		if [ -n "$name" ]; then
			exec /usr/sbin/modprobe "$@"
		fi
		name=$(printf '%s' "$a" | tr - _)
		;;
	esac
done
case $pretend in
*" $name "*) exit 0 ;;
esac
exec /usr/sbin/modprobe "$@"
`
}

// meminfo returns this machine's /proc/meminfo with MemTotal set to mib MiB and MemFree and
// MemAvailable at most 85% and 90% of it.
func meminfo(mib int) (string, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "", err
	}
	total := uint64(mib) * 1024
	limits := map[string]uint64{"MemTotal": total, "MemFree": total * 85 / 100, "MemAvailable": total * 90 / 100}
	var out strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		key, rest, _ := strings.Cut(line, ":")
		if limit, ok := limits[key]; ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return "", fmt.Errorf("parse /proc/meminfo %s: %w", key, err)
			}
			if key == "MemTotal" || kb > limit {
				kb = limit
			}
			line = fmt.Sprintf("%-15s %8d kB", key+":", kb)
		}
		out.WriteString(line + "\n")
	}
	return out.String(), nil
}

// machineCPUs lists the CPUs this process may run on.
func machineCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("read the CPU affinity: %w", err)
	}
	var cpus []int
	for i := range len(set) * 64 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// writeKey writes a new ed25519 private key in OpenSSH format to path and returns its public key.
func writeKey(path string) (ssh.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "kip lab")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, err
	}
	return ssh.NewPublicKey(pub)
}

// createNet makes the host's network namespace with eth0 on the private bridge and eth1 on the
// public one, which holds the default route.
func (h *Host) createNet(ctx context.Context) error {
	ns := h.netns()
	cmds := [][]string{
		{"netns", "add", ns},
		{"link", "add", h.veth("private"), "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "add", h.veth("public"), "type", "veth", "peer", "name", "eth1", "netns", ns},
		{"link", "set", h.veth("private"), "master", privateBridge, "up"},
		{"link", "set", h.veth("public"), "master", publicBridge, "up"},
		{"-n", ns, "addr", "add", h.PrivateIP.String() + "/24", "dev", "eth0"},
		{"-n", ns, "addr", "add", h.PublicIP.String() + "/24", "dev", "eth1"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "link", "set", "eth1", "up"},
		{"-n", ns, "route", "add", "default", "via", Gateway},
	}
	for _, c := range cmds {
		if err := run(ctx, "ip", c...); err != nil {
			return err
		}
	}
	return nil
}

// boot starts the host: boot.sh runs systemd-nspawn, detached from this process.
func (h *Host) boot() error {
	cgroups, err := cgroupDirs(h.Name)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(h.dir(), "cgroups"), []byte(strings.Join(cgroups, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if err := makeCgroups(cgroups); err != nil {
		return err
	}
	args := []string{
		"--boot", "--register=no", "--keep-unit",
		"--directory=" + h.root(),
		"--machine=" + h.Name, "--hostname=" + h.Name,
		"--network-namespace-path=/run/netns/" + h.netns(),
		"--capability=CAP_NET_ADMIN,CAP_NET_RAW,CAP_SYS_MODULE",
		// runc gives each container a session keyring, which nspawn's filter refuses.
		"--system-call-filter=@keyring",
		"--resolv-conf=off", "--timezone=off", "--link-journal=no", "--console=read-only",
		// containerd's overlayfs snapshots cannot sit on the host's overlayfs disk.
		"--bind=" + h.containerdDir() + ":" + containerdPath,
	}
	for _, t := range kubeletTunables {
		args = append(args, "--bind-ro="+tunablesDir+"/"+t.key+":/proc/sys/"+t.key)
	}
	if h.MemoryMiB > 0 {
		args = append(args, "--bind-ro="+meminfoPath+":/proc/meminfo")
	}
	if h.LonghornDiskGiB > 0 {
		args = append(args, "--bind="+h.longhornMount()+":"+longhornPath)
	}
	cpus, err := machineCPUs()
	if err != nil {
		return err
	}
	if h.CPUs > 0 && h.CPUs <= len(cpus) {
		list := make([]string, h.CPUs)
		for i := range list {
			list[i] = strconv.Itoa(cpus[i])
		}
		args = append(args, "--cpu-affinity="+strings.Join(list, ","))
	}
	for _, b := range h.lab.st.ReadOnly {
		target := b.Target
		if target == "" {
			target = b.Source
		}
		args = append(args, "--bind-ro="+b.Source+":"+target)
	}
	shArgs := append([]string{"-c", bootScript, bootMarker + h.Name}, cgroups...)
	shArgs = append(append(shArgs, "--"), args...)
	_, err = startDetached("sh", shArgs, []string{"SYSTEMD_NSPAWN_API_VFS_WRITABLE=network"}, h.logPath(), h.pidPath(), bootMarker+h.Name)
	return err
}

// cgroupDirs returns the cgroups of the host's own, below this process's: one per hierarchy,
// systemd's (name=systemd of cgroup v1, and the unified one) and each cgroup v1 controller's,
// so that the containers a host runs are limited and counted in its own cgroups, apart from
// other hosts' and from this machine's.
func cgroupDirs(name string) ([]string, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return hostCgroups(name, string(self), string(mounts))
}

// hostCgroups is cgroupDirs on a process's /proc/self/cgroup and mountinfo.
func hostCgroups(name, self, mounts string) ([]string, error) {
	var v2 string // mount point of the unified hierarchy
	type v1Mount struct {
		path string
		opts []string // super options: rw, the controllers, name=…, xattr, …
	}
	var v1 []v1Mount
	for line := range strings.Lines(mounts) {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		switch g[0] {
		case "cgroup2":
			if v2 == "" {
				v2 = f[4]
			}
		case "cgroup":
			v1 = append(v1, v1Mount{f[4], strings.Split(g[2], ",")})
		}
	}
	// The v1 hierarchy whose mount has every one of ctrls ("cpu,cpuacct", "name=systemd").
	mountOf := func(ctrls string) string {
		for _, m := range v1 {
			if !slices.ContainsFunc(strings.Split(ctrls, ","), func(c string) bool { return !slices.Contains(m.opts, c) }) {
				return m.path
			}
		}
		return ""
	}
	var dirs []string
	systemd := false
	for line := range strings.Lines(self) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "" && v2 != "":
			dirs, systemd = append(dirs, filepath.Join(v2, parts[2], "kip-"+name)), true
		case parts[1] != "" && mountOf(parts[1]) != "":
			dirs = append(dirs, filepath.Join(mountOf(parts[1]), parts[2], "kip-"+name))
			systemd = systemd || parts[1] == "name=systemd"
		}
	}
	if !systemd {
		return nil, errors.New("no systemd or unified cgroup hierarchy is mounted")
	}
	return dirs, nil
}

// makeCgroups creates the host's cgroups. A new cpuset cgroup has no CPUs or memory nodes, and
// no process can join it until it has: it gets its parent's.
func makeCgroups(dirs []string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(filepath.Dir(d), f))
			if errors.Is(err, fs.ErrNotExist) {
				break // not the cpuset hierarchy
			}
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("set %s of %s: %w", f, d, err)
			}
		}
	}
	return nil
}

// supervisor returns the pid of the script running the host, or 0 when it is not running.
func (h *Host) supervisor() int { return readPid(h.pidPath(), bootMarker+h.Name) }

// init returns the host's init (systemd, the child of systemd-nspawn) as this machine sees it,
// or 0.
func (h *Host) init() int {
	nspawn := childNamed(h.supervisor(), "systemd-nspawn")
	if nspawn == 0 {
		return 0
	}
	if kids := children(nspawn); len(kids) == 1 {
		return kids[0]
	}
	return 0
}

// Path is where this machine sees path of the host's file system, while the host runs: a test
// can read or change a host's files there when the host cannot be reached over the network. A
// path on a host's Longhorn disk is on that disk's mount here.
func (h *Host) Path(path string) string {
	if rest, ok := strings.CutPrefix(filepath.Clean("/"+path), longhornPath); ok && h.LonghornDiskGiB > 0 && (rest == "" || rest[0] == '/') {
		return filepath.Join(h.longhornMount(), rest)
	}
	return filepath.Join(h.root(), path)
}

// Resize changes the RAM the host shows (MemTotal in its /proc/meminfo) to mib MiB, as resizing a
// cloud server does, at once. Only a host sized with HostOptions.MemoryMiB has a meminfo to change.
func (h *Host) Resize(mib int) error {
	if h.MemoryMiB == 0 {
		return fmt.Errorf("host %s shows this machine's memory: give it HostOptions.MemoryMiB to resize it", h.Name)
	}
	mi, err := meminfo(mib)
	if err != nil {
		return err
	}
	// Written in place: the host's /proc/meminfo is a bind mount of this very file.
	f, err := os.OpenFile(h.Path(meminfoPath), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("resize host %s: %w", h.Name, err)
	}
	if _, err := f.WriteString(mi); err != nil {
		f.Close()
		return fmt.Errorf("resize host %s: %w", h.Name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("resize host %s: %w", h.Name, err)
	}
	h.MemoryMiB = mib
	return nil
}

// Running reports whether the host is running (booting, up or shutting down).
func (h *Host) Running() bool { return h.supervisor() != 0 }

// SSHConfig returns how to reach the host as root at addr (its PrivateIP or PublicIP), verifying
// its key with the lab's known_hosts file.
func (h *Host) SSHConfig(addr netip.Addr) sshx.Config {
	return sshx.Config{
		Host:           addr.String(),
		Port:           22,
		User:           "root",
		KeyPath:        h.KeyPath,
		KnownHostsPath: h.lab.KnownHostsPath,
		Timeout:        5 * time.Second,
		SSHConfigPath:  os.DevNull,
	}
}

// Run runs cmd (a shell command line: build it with sshx.Quote) as root on the host over its
// public address and returns its standard output; a non-zero exit status is an error.
func (h *Host) Run(ctx context.Context, cmd string) (string, error) {
	c, err := h.sshClient(ctx)
	if err != nil {
		return "", err
	}
	res, err := c.Run(ctx, cmd)
	if err != nil {
		return "", err
	}
	return string(res.Stdout), res.Err()
}

// sshClient returns Run's connection, dialling it on first use.
func (h *Host) sshClient(ctx context.Context) (*sshx.Client, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.client == nil {
		c, err := sshx.Dial(ctx, h.SSHConfig(h.PublicIP))
		if err != nil {
			return nil, err
		}
		h.client = c
	}
	return h.client, nil
}

func (h *Host) closeClient() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.client != nil {
		h.client.Close()
		h.client = nil
	}
}

// WaitReady waits until the host accepts SSH and systemd has finished starting it, running or
// degraded (a unit failed).
func (h *Host) WaitReady(ctx context.Context) error {
	state, err := h.waitReady(ctx)
	if err != nil {
		return err
	}
	if state != "running" && state != "degraded" {
		return fmt.Errorf("%s is %s after booting", h.Name, state)
	}
	return nil
}

// bootTimeout bounds the wait for a host to boot (about 2 s when the machine is idle).
const bootTimeout = 2 * time.Minute

// waitReady waits for SSH and then for systemd to finish starting the host, and returns what
// `systemctl is-system-running` says then.
func (h *Host) waitReady(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	var last error
	for {
		if !h.Running() {
			return "", fmt.Errorf("%s stopped while booting: %s", h.Name, h.consoleTail())
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := sshx.Dial(dctx, h.SSHConfig(h.PublicIP))
		cancel()
		if err == nil {
			h.mu.Lock()
			if h.client != nil {
				h.client.Close()
			}
			h.client = c
			h.mu.Unlock()
			break
		}
		last = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s does not accept SSH: %w", h.Name, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
	out, err := h.Run(ctx, "systemctl is-system-running --wait")
	if state := strings.TrimSpace(out); state != "" {
		return state, nil
	}
	return "", fmt.Errorf("%s: systemctl is-system-running: %w", h.Name, err)
}

// consoleTail returns the last lines the host's console and systemd-nspawn printed.
func (h *Host) consoleTail() string {
	b, _ := os.ReadFile(h.logPath())
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-8):], "\n")
}

// Stop powers the host off cleanly (systemd-nspawn turns SIGTERM into a halt of the host) and
// waits for it; its disk is kept for Start. When ctx ends first, the host is killed.
func (h *Host) Stop(ctx context.Context) error {
	h.closeClient()
	sup := h.supervisor()
	if sup == 0 {
		return nil
	}
	if nspawn := childNamed(sup, "systemd-nspawn"); nspawn != 0 {
		syscall.Kill(nspawn, syscall.SIGTERM)
	}
	if err := waitGone(ctx, sup); err != nil {
		return errors.Join(fmt.Errorf("stop %s: it did not power off: %w", h.Name, err), h.kill(sup))
	}
	return nil
}

// Start boots a stopped (or killed) host again on its disk and waits until it is ready.
func (h *Host) Start(ctx context.Context) error {
	if h.Running() {
		return fmt.Errorf("start %s: it is running", h.Name)
	}
	if err := h.boot(); err != nil {
		return fmt.Errorf("start %s: %w", h.Name, err)
	}
	return h.WaitReady(ctx)
}

// Kill ends the host as a power cut would: SIGKILL to its init, which takes every process of the
// host with it; systemd-nspawn then exits. The disk keeps what was written.
func (h *Host) Kill() error {
	h.closeClient()
	sup := h.supervisor()
	if sup == 0 {
		return fmt.Errorf("kill %s: it is not running", h.Name)
	}
	if err := h.kill(sup); err != nil {
		return fmt.Errorf("kill %s: %w", h.Name, err)
	}
	return nil
}

// kill sends SIGKILL to the host's init and waits for its supervisor to end, killing
// systemd-nspawn and the supervisor too if they linger.
func (h *Host) kill(sup int) error {
	if init := h.init(); init != 0 {
		syscall.Kill(init, syscall.SIGKILL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if waitGone(ctx, sup) == nil {
		return nil
	}
	if nspawn := childNamed(sup, "systemd-nspawn"); nspawn != 0 {
		if err := killWait(nspawn); err != nil {
			return err
		}
	}
	return killWait(sup)
}

// Partition cuts the host off a network, "private" or "public", or both for "": its link to the
// bridge goes down, so nothing reaches it or leaves it there, from other hosts or this machine.
func (h *Host) Partition(ctx context.Context, network string) error {
	return h.setLinks(ctx, network, "down")
}

// Heal undoes Partition for a network, or both for "".
func (h *Host) Heal(ctx context.Context, network string) error {
	return h.setLinks(ctx, network, "up")
}

func (h *Host) setLinks(ctx context.Context, network, state string) error {
	var nets []string
	switch network {
	case "private", "public":
		nets = []string{network}
	case "":
		nets = []string{"private", "public"}
	default:
		return fmt.Errorf("no network %q: it is private, public or empty for both", network)
	}
	for _, n := range nets {
		if err := run(ctx, "ip", "link", "set", h.veth(n), state); err != nil {
			return fmt.Errorf("set %s's %s link %s: %w", h.Name, n, state, err)
		}
	}
	return nil
}

// ThrottleLonghornDisk limits the writes the host's processes make to its Longhorn disk to iops
// a second, or lifts the limit with 0, through the cgroup v1 blkio controller of the host's own
// cgroup: a slow disk whatever this machine's own disk is like. Only the host's own processes are
// limited (those its SSH sessions run among them); containers in cgroups of their own are not.
func (h *Host) ThrottleLonghornDisk(iops int) error {
	loops := loopsBacking("/sys/block", h.longhornImage())
	if len(loops) != 1 {
		return fmt.Errorf("throttle %s's Longhorn disk: %d loop devices back %s", h.Name, len(loops), h.longhornImage())
	}
	dev, err := os.ReadFile(filepath.Join("/sys/block", loops[0], "dev"))
	if err != nil {
		return err
	}
	dirs, err := cgroupDirs(h.Name)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		f := filepath.Join(d, "blkio.throttle.write_iops_device")
		if _, err := os.Stat(f); err == nil {
			return os.WriteFile(f, fmt.Appendf(nil, "%s %d\n", strings.TrimSpace(string(dev)), iops), 0o644)
		}
	}
	return fmt.Errorf("throttle %s's Longhorn disk: the host has no blkio cgroup of its own (%v)", h.Name, dirs)
}

// RSS returns the resident anonymous memory of the host, in bytes: total_rss of its own memory
// cgroup, which holds every process of the host, its containers' too, each page counted once.
// Pages mapped from files (the programs themselves) are the cgroup's cache, not counted here.
func (h *Host) RSS() (uint64, error) {
	if h.init() == 0 {
		return 0, fmt.Errorf("%s is not running", h.Name)
	}
	b, err := os.ReadFile(filepath.Join(h.dir(), "cgroups"))
	if err != nil {
		return 0, err
	}
	for _, cg := range strings.Fields(string(b)) {
		stat, err := os.ReadFile(filepath.Join(cg, "memory.stat"))
		if err != nil {
			continue // not the memory hierarchy
		}
		for line := range strings.Lines(string(stat)) {
			if v, ok := strings.CutPrefix(line, "total_rss "); ok {
				return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("%s has no memory cgroup of its own", h.Name)
}

// removeHost removes everything of the host called name: its processes, disks, network
// namespace, links, cgroups and records. What is already gone is skipped.
func removeHost(ctx context.Context, name string) error {
	h := &Host{Name: name}
	var errs []error
	if sup := h.supervisor(); sup != 0 {
		errs = append(errs, h.kill(sup))
	}
	mounts := []string{h.longhornMount(), h.root()}
	for _, m := range mounts {
		if mounted(m) {
			if err := syscall.Unmount(m, 0); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	// Unmounting releases the Longhorn disk's loop device (mount -o loop sets autoclear); one
	// still bound to the image was left behind unmounted (a mount that did not finish). The
	// kernel may clear a device the unmount released only after it was listed here: a detach
	// that fails counts only when the device still backs the image afterwards.
	for _, dev := range loopsBacking(sysBlock, h.longhornImage()) {
		if err := run(ctx, "losetup", "-d", "/dev/"+dev); err != nil && slices.Contains(loopsBacking(sysBlock, h.longhornImage()), dev) {
			errs = append(errs, err)
		}
	}
	if !slices.ContainsFunc(mounts, mounted) { // RemoveAll would empty a mounted file system
		errs = append(errs, os.RemoveAll(filepath.Dir(h.root())))
	}
	if _, err := os.Stat("/run/netns/" + h.netns()); err == nil {
		errs = append(errs, run(ctx, "ip", "netns", "del", h.netns()))
	}
	for _, n := range []string{"private", "public"} {
		errs = append(errs, deleteLink(ctx, h.veth(n)))
	}
	if b, err := os.ReadFile(filepath.Join(h.dir(), "cgroups")); err == nil {
		for _, cg := range strings.Fields(string(b)) {
			errs = append(errs, removeCgroup(cg))
		}
	}
	// systemd-nspawn leaves this directory behind when /run is not a tmpfs.
	errs = append(errs, os.RemoveAll("/run/systemd/nspawn/propagate/"+name))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.RemoveAll(h.dir())
}

// mounted reports whether path is a mount point.
func mounted(path string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// loopsBacking returns the loop devices (loop0, …) listed in sysBlock whose backing file is
// file, also after file was deleted.
func loopsBacking(sysBlock, file string) []string {
	paths, _ := filepath.Glob(filepath.Join(sysBlock, "loop*", "loop", "backing_file"))
	var devs []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		if strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == file {
			devs = append(devs, filepath.Base(filepath.Dir(filepath.Dir(p))))
		}
	}
	return devs
}

// removeCgroup removes a cgroup and those below it, deepest first.
func removeCgroup(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(dirs[i]); err != nil && err != syscall.ENOENT {
			return fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
		}
	}
	return nil
}
