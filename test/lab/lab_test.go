package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gofrs/flock"

	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/need"
)

// TestLab brings up three hosts and proves what kip's tests rely on: systemd, SSH over both
// networks, drop-ins, apt through the cache, ufw, sizes, partitions, stop/start, kill and
// reboot, and that nothing of the lab is left, or routes out of the machine, after Down.
func TestLab(t *testing.T) {
	need.Lab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	defaultDevs := defaultRouteDevs(t)

	bindDir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(bindDir, "hello"), []byte("from the machine\n"), 0o644))
	start := time.Now()
	l, err := Up(ctx, 3, Options{
		Hosts:    []HostOptions{{MemoryMiB: 4096, CPUs: 1}, {MemoryMiB: 8192, CPUs: 4}},
		ReadOnly: []Bind{{Source: bindDir, Target: "/opt/kip-bind"}},
		Logf:     t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: lab of 3 hosts up in %s", time.Since(start).Round(100*time.Millisecond))
	down := sync.OnceValue(func() error { return l.Down(context.Background()) })
	t.Cleanup(func() { down() })
	lab1, lab2, lab3 := l.Hosts[0], l.Hosts[1], l.Hosts[2]

	t.Run("boot", func(t *testing.T) {
		for _, h := range l.Hosts {
			out := run1(ctx, t, h, "systemctl is-system-running; hostname; cat /opt/kip-bind/hello")
			if want := "running\n" + h.Name + "\nfrom the machine\n"; out != want {
				t.Errorf("%s: got %q, want %q", h.Name, out, want)
			}
		}
	})

	t.Run("ssh", func(t *testing.T) {
		// kip's own known_hosts: every address is trusted on first use, then verified.
		known := filepath.Join(t.TempDir(), "known_hosts")
		for _, h := range l.Hosts {
			for _, addr := range []netip.Addr{h.PrivateIP, h.PublicIP} {
				for i := range 2 {
					cfg := h.SSHConfig(addr)
					cfg.KnownHostsPath = known
					var notices []string
					cfg.Notify = func(msg string) { notices = append(notices, msg) }
					c, err := sshx.Dial(ctx, cfg)
					if err != nil {
						t.Fatalf("%s at %s: %v", h.Name, addr, err)
					}
					res, err := c.Run(ctx, "hostname; ip -4 -o addr show")
					c.Close()
					if err != nil || res.Err() != nil {
						t.Fatalf("%s at %s: %v %v", h.Name, addr, err, res.Err())
					}
					if out := string(res.Stdout); !strings.HasPrefix(out, h.Name+"\n") || !strings.Contains(out, addr.String()+"/24") {
						t.Errorf("%s at %s: %q", h.Name, addr, out)
					}
					if len(notices) != 1-i { // a notice the first time only
						t.Errorf("%s at %s, dial %d: notices %q", h.Name, addr, i+1, notices)
					}
				}
			}
		}
		b, err := os.ReadFile(known)
		must(t, err)
		if n := strings.Count(string(b), "\n"); n != 6 {
			t.Errorf("known_hosts has %d lines, want 6 (one per address):\n%s", n, b)
		}
	})

	t.Run("sizes", func(t *testing.T) {
		cpus, err := machineCPUs()
		must(t, err)
		machineMiB := memTotalMiB(t)
		for _, tc := range []struct {
			h         *Host
			mib, cpus int
		}{{lab1, 4096, 1}, {lab2, 8192, 4}, {lab3, machineMiB, len(cpus)}} {
			c, err := sshx.Dial(ctx, tc.h.SSHConfig(tc.h.PublicIP))
			must(t, err)
			f, err := c.Facts(ctx, "/")
			c.Close()
			must(t, err)
			if int(f.MemTotalMiB) != tc.mib || f.CPUs != tc.cpus {
				t.Errorf("%s: %d MiB and %d CPUs, want %d MiB and %d CPUs", tc.h.Name, f.MemTotalMiB, f.CPUs, tc.mib, tc.cpus)
			}
			if f.Init != "systemd" || f.OS.ID != "debian" || f.OS.VersionID != "12" {
				t.Errorf("%s: init %q, OS %+v", tc.h.Name, f.Init, f.OS)
			}
		}
	})

	t.Run("dropin", func(t *testing.T) {
		// RemainAfterExit keeps the unit loaded: an inactive unit would be unloaded and read
		// afresh, drop-in included, by the next start.
		unit := "[Unit]\nDescription=kip lab drop-in test\n[Service]\nType=oneshot\nRemainAfterExit=yes\nEnvironment=KIP_VALUE=base\n" +
			"ExecStart=/bin/sh -c 'echo \"$KIP_VALUE\" >/run/kip-dropin'\n"
		c := dial(ctx, t, lab1)
		must(t, c.Upload(ctx, "/etc/systemd/system/kip-dropin.service", []byte(unit), 0o644, ""))
		run1(ctx, t, lab1, "systemctl daemon-reload && systemctl start kip-dropin")
		if got := run1(ctx, t, lab1, "cat /run/kip-dropin"); got != "base\n" {
			t.Fatalf("before the drop-in: %q", got)
		}
		run1(ctx, t, lab1, "mkdir -p /etc/systemd/system/kip-dropin.service.d")
		must(t, c.Upload(ctx, "/etc/systemd/system/kip-dropin.service.d/10-kip.conf", []byte("[Service]\nEnvironment=KIP_VALUE=override\n"), 0o644, ""))
		run1(ctx, t, lab1, "systemctl restart kip-dropin")
		if got := run1(ctx, t, lab1, "cat /run/kip-dropin"); got != "base\n" {
			t.Fatalf("the drop-in took effect before daemon-reload: %q", got)
		}
		run1(ctx, t, lab1, "systemctl daemon-reload && systemctl restart kip-dropin")
		if got := run1(ctx, t, lab1, "cat /run/kip-dropin"); got != "override\n" {
			t.Fatalf("after daemon-reload: %q", got)
		}
	})

	t.Run("apt", func(t *testing.T) {
		start := time.Now()
		run1(ctx, t, lab1, "apt-get update -qq")
		updated := time.Since(start)
		run1(ctx, t, lab1, "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends open-iscsi nfs-common wireguard-tools ufw")
		t.Logf("measured: apt-get update %s, install of open-iscsi nfs-common wireguard-tools ufw %s through the cache",
			updated.Round(100*time.Millisecond), (time.Since(start) - updated).Round(100*time.Millisecond))
		out := run1(ctx, t, lab1, "for c in iscsiadm mount.nfs wg ufw; do command -v $c; done")
		if strings.Count(out, "\n") != 4 {
			t.Errorf("installed commands: %q", out)
		}
		// A package whose service cannot start in a container would leave the host degraded.
		if state, failed := systemState(ctx, t, lab1); state != "running" {
			t.Errorf("after the install lab1 is %s: failed units: %s", state, failed)
		}
	})

	t.Run("ufw", func(t *testing.T) {
		// A listener made of systemd alone: each connection gets "kip" back.
		must(t, dial(ctx, t, lab1).Upload(ctx, "/etc/systemd/system/kip-listen.socket",
			[]byte("[Socket]\nListenStream=8080\nAccept=yes\n[Install]\nWantedBy=sockets.target\n"), 0o644, ""))
		must(t, dial(ctx, t, lab1).Upload(ctx, "/etc/systemd/system/kip-listen@.service",
			[]byte("[Service]\nExecStart=/bin/echo kip\nStandardOutput=socket\n"), 0o644, ""))
		run1(ctx, t, lab1, "systemctl daemon-reload && systemctl start kip-listen.socket")
		for _, h := range []*Host{lab2, lab3} {
			if !connects(ctx, t, h, lab1.PrivateIP, 8080) {
				t.Fatalf("%s cannot reach port 8080 on lab1 before any rule", h.Name)
			}
		}
		run1(ctx, t, lab1, strings.Join([]string{
			"ufw allow 22/tcp",
			sshx.Command("ufw", "deny", "from", lab2.PrivateIP.String(), "to", "any", "port", "8080", "proto", "tcp"),
			"ufw allow 8080/tcp",
			"ufw --force enable",
		}, " && "))
		if connects(ctx, t, lab2, lab1.PrivateIP, 8080) {
			t.Error("lab2 reaches port 8080 on lab1 despite the ufw rule")
		}
		if !connects(ctx, t, lab3, lab1.PrivateIP, 8080) {
			t.Error("lab3 cannot reach port 8080 on lab1")
		}
		run1(ctx, t, lab1, "ufw --force disable")
		if !connects(ctx, t, lab2, lab1.PrivateIP, 8080) {
			t.Error("lab2 cannot reach port 8080 on lab1 after ufw disable")
		}
	})

	t.Run("partition", func(t *testing.T) {
		dialAt := func(addr netip.Addr) error {
			cfg := lab2.SSHConfig(addr)
			cfg.Timeout = time.Second
			dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			c, err := sshx.Dial(dctx, cfg)
			if err == nil {
				c.Close()
			}
			return err
		}
		must(t, lab2.Partition(ctx, "public"))
		err := dialAt(lab2.PublicIP)
		if err == nil || !strings.Contains(err.Error(), lab2.PublicIP.String()) {
			t.Errorf("dial of the partitioned public address: %v", err)
		}
		t.Logf("error while partitioned: %v", err)
		if err := dialAt(lab2.PrivateIP); err != nil {
			t.Errorf("the private network was not partitioned: %v", err)
		}
		if connects(ctx, t, lab3, lab2.PublicIP, 22) {
			t.Error("lab3 reaches lab2's partitioned public address")
		}
		must(t, lab2.Partition(ctx, ""))
		if err := dialAt(lab2.PrivateIP); err == nil {
			t.Error("dial of the partitioned private address succeeded")
		}
		must(t, lab2.Heal(ctx, ""))
		for _, addr := range []netip.Addr{lab2.PublicIP, lab2.PrivateIP} {
			if err := dialAt(addr); err != nil {
				t.Errorf("after heal, %s: %v", addr, err)
			}
		}
	})

	t.Run("stop-start", func(t *testing.T) {
		boot := run1(ctx, t, lab3, "cat /proc/sys/kernel/random/boot_id")
		run1(ctx, t, lab3, "echo kept >/root/marker && sync")
		start := time.Now()
		must(t, lab3.Stop(ctx))
		t.Logf("stopped in %s", time.Since(start).Round(100*time.Millisecond))
		if lab3.Running() {
			t.Fatal("lab3 runs after Stop")
		}
		start = time.Now()
		must(t, lab3.Start(ctx))
		t.Logf("started in %s", time.Since(start).Round(100*time.Millisecond))
		if got := run1(ctx, t, lab3, "cat /root/marker"); got != "kept\n" {
			t.Errorf("marker after restart: %q", got)
		}
		if run1(ctx, t, lab3, "cat /proc/sys/kernel/random/boot_id") == boot {
			t.Error("the boot id did not change: no reboot happened")
		}
		if state, failed := systemState(ctx, t, lab3); state != "running" {
			t.Errorf("after restart lab3 is %s: %s", state, failed)
		}
	})

	t.Run("kill", func(t *testing.T) {
		boot := run1(ctx, t, lab3, "cat /proc/sys/kernel/random/boot_id")
		run1(ctx, t, lab3, "echo before-kill >/root/marker2")
		must(t, lab3.Kill())
		if lab3.Running() {
			t.Fatal("lab3 runs after Kill")
		}
		must(t, lab3.Start(ctx))
		if run1(ctx, t, lab3, "cat /proc/sys/kernel/random/boot_id") == boot {
			t.Error("the boot id did not change")
		}
		if got := run1(ctx, t, lab3, "cat /root/marker2"); got != "before-kill\n" {
			t.Errorf("marker after kill: %q", got)
		}
	})

	t.Run("reboot", func(t *testing.T) {
		// A reboot from inside the host (as `kip node reboot` does) brings it back.
		boot := run1(ctx, t, lab2, "cat /proc/sys/kernel/random/boot_id")
		lab2.Run(ctx, "systemctl reboot") // the connection may drop before an answer
		deadline := time.Now().Add(2 * time.Minute)
		for {
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			err := lab2.WaitReady(rctx)
			cancel()
			if err == nil {
				if b := run1(ctx, t, lab2, "cat /proc/sys/kernel/random/boot_id"); b != boot {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("lab2 did not come back from a reboot: %v", err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	t.Run("guard", func(t *testing.T) {
		checkRoutes(t, defaultDevs, true)
		// A listener on every address of this machine: hosts reach it at the public bridge's
		// address only, not at this machine's other addresses.
		ln, err := net.Listen("tcp4", ":0")
		must(t, err)
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		if !connects(ctx, t, lab1, netip.MustParseAddr(Gateway), port) {
			t.Error("lab1 cannot reach this machine at the gateway")
		}
		if other := otherLocalAddr(t); other.IsValid() {
			if connects(ctx, t, lab1, other, port) {
				t.Errorf("lab1 reaches this machine at %s", other)
			}
		}
	})

	t.Run("memory", func(t *testing.T) {
		for _, h := range l.Hosts {
			rss, err := h.RSS()
			must(t, err)
			t.Logf("measured: %s RSS %d MiB", h.Name, rss>>20)
		}
	})

	var pids []int
	for _, h := range l.Hosts {
		sup := h.supervisor()
		pids = append(pids, sup, childNamed(sup, "systemd-nspawn"), h.init())
	}
	pids = append(pids, readPid(aptPidFile, aptConfDir))
	var cgroups []string
	for _, h := range l.Hosts {
		b, err := os.ReadFile(filepath.Join(h.dir(), "cgroups"))
		must(t, err)
		cgroups = append(cgroups, strings.Fields(string(b))...)
	}
	start = time.Now()
	if err := down(); err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: Down in %s", time.Since(start).Round(100*time.Millisecond))

	// Hold the lab lock while looking, so that no other process's lab is counted.
	lock := flock.New(lockPath)
	_, err = lock.TryLockContext(ctx, 100*time.Millisecond)
	must(t, err)
	defer lock.Unlock()
	for _, pid := range pids {
		if pid != 0 && alive(pid) {
			t.Errorf("process %d (%s) lives after Down", pid, cmdline(pid))
		}
	}
	for _, comm := range []string{"systemd-nspawn", "apt-cacher-ng"} {
		if out, err := exec.Command("pgrep", "-x", comm).Output(); err == nil {
			t.Errorf("%s processes after Down: %s", comm, out)
		}
	}
	links, err := net.Interfaces()
	must(t, err)
	for _, l := range links {
		if strings.HasPrefix(l.Name, "kip-") {
			t.Errorf("interface %s after Down", l.Name)
		}
	}
	if ents, _ := os.ReadDir("/run/netns"); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), netnsPrefix) {
				t.Errorf("network namespace %s after Down", e.Name())
			}
		}
	}
	for _, c := range fwChains {
		if exec.Command("iptables", "-w", "-n", "-L", c.name).Run() == nil {
			t.Errorf("iptables chain %s after Down", c.name)
		}
	}
	for _, d := range append([]string{stateDir, diskDir}, cgroups...) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s after Down", d)
		}
	}
	tarball, dir := imagePaths()
	for _, p := range []string{tarball, dir, filepath.Join(cacheDir(), "apt-cacher-ng")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the cache lost %s: %v", p, err)
		}
	}
	checkRoutes(t, defaultDevs, false)
}

// TestLonghornDisk brings up one host with a Longhorn disk and checks that df in the host shows
// its size, that the image is sparse, that a file there survives Stop and Start, that the next
// Up removes it, mounted, when the process that brought it up died, and that Down leaves no
// mount or loop device, not even one bound to the image by hand.
func TestLonghornDisk(t *testing.T) {
	need.Lab(t)
	need.Command(t, "mkfs.ext4", "make test-deps installs it")
	need.Command(t, "losetup", "make test-deps installs it")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var cur *Lab // the lab to remove at the end
	t.Cleanup(func() {
		if cur != nil {
			cur.Down(context.Background())
		}
	})
	up := func(gib int) *Host {
		start := time.Now()
		l, err := Up(ctx, 1, Options{Hosts: []HostOptions{{LonghornDiskGiB: gib}}, Logf: t.Logf})
		must(t, err)
		cur = l
		t.Logf("measured: a host with a %d GiB Longhorn disk up in %s", gib, time.Since(start).Round(100*time.Millisecond))
		return l.Hosts[0]
	}
	checkDF := func(h *Host, gib int) {
		t.Helper()
		out := run1(ctx, t, h, "df -B1 --output=target,size "+longhornPath+" | tail -n 1")
		f := strings.Fields(out)
		if len(f) != 2 || f[0] != longhornPath {
			t.Fatalf("df in %s: %q, want the file system mounted at %s", h.Name, out, longhornPath)
		}
		size, err := strconv.ParseInt(f[1], 10, 64)
		must(t, err)
		// ext4's metadata (inode tables, journal) takes a little over 2%.
		if want := int64(gib) << 30; size > want || size < want*95/100 {
			t.Errorf("df in %s: %s is %d bytes, want a little under %d GiB (%d)", h.Name, longhornPath, size, gib, want)
		}
		t.Logf("df in %s: %s is %d bytes, %.1f%% of %d GiB", h.Name, longhornPath, size, float64(size)*100/float64(int64(gib)<<30), gib)
	}
	countMounts := func(path string) int {
		b, err := os.ReadFile("/proc/mounts")
		must(t, err)
		n := 0
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) > 1 && f[1] == path {
				n++
			}
		}
		return n
	}

	h := up(40)
	img, mnt := h.longhornImage(), h.longhornMount()
	checkDF(h, 40)
	st, err := loadState()
	must(t, err)
	if st.Hosts[0].LonghornDiskGiB != 40 || h.LonghornDiskGiB != 40 {
		t.Errorf("recorded Longhorn disk: %d GiB in lab.json, %d GiB on the host", st.Hosts[0].LonghornDiskGiB, h.LonghornDiskGiB)
	}
	var fi syscall.Stat_t
	must(t, syscall.Stat(img, &fi))
	t.Logf("measured: the 40 GiB image takes %d KiB", fi.Blocks/2)
	if fi.Size != 40<<30 || fi.Blocks*512 > 64<<20 {
		t.Errorf("image %s: size %d, %d bytes allocated; want 40 GiB, sparse", img, fi.Size, fi.Blocks*512)
	}

	run1(ctx, t, h, "echo kept >"+longhornPath+"/marker && sync")
	start := time.Now()
	must(t, h.Stop(ctx))
	must(t, h.Start(ctx))
	t.Logf("measured: Stop and Start in %s", time.Since(start).Round(100*time.Millisecond))
	if got := run1(ctx, t, h, "cat "+longhornPath+"/marker"); got != "kept\n" {
		t.Errorf("marker after Stop and Start: %q", got)
	}
	checkDF(h, 40)

	// The process that brought the lab up dies: its lock goes, the host keeps running and the
	// disk stays mounted. The next Up removes that lab and makes a new disk in the same place.
	h.closeClient()
	cur.lock.Unlock()
	cur = nil
	if n, loops := countMounts(mnt), loopsBacking(sysBlock, img); n != 1 || len(loops) != 1 {
		t.Fatalf("left behind: %d mounts at %s, loop devices %q", n, mnt, loops)
	}
	h = up(20)
	checkDF(h, 20)
	run1(ctx, t, h, "test ! -e "+longhornPath+"/marker")
	if n, loops := countMounts(mnt), loopsBacking(sysBlock, img); n != 1 || len(loops) != 1 {
		t.Errorf("after the next Up: %d mounts at %s, loop devices %q; want the new disk's only", n, mnt, loops)
	}

	// A loop device bound to the image without a mount, as a mount that did not finish leaves
	// one: Down detaches it too.
	stray, err := exec.Command("losetup", "--find", "--show", img).Output()
	must(t, err)
	t.Logf("stray loop device %s", strings.TrimSpace(string(stray)))

	start = time.Now()
	err = cur.Down(ctx)
	cur = nil
	must(t, err)
	t.Logf("measured: Down in %s", time.Since(start).Round(100*time.Millisecond))
	out, err := exec.Command("losetup", "-a").CombinedOutput()
	must(t, err)
	if strings.Contains(string(out), img) {
		t.Errorf("losetup -a after Down:\n%s", out)
	}
	mounts, err := os.ReadFile("/proc/mounts")
	must(t, err)
	if strings.Contains(string(mounts), diskDir) {
		t.Errorf("mounts under %s after Down:\n%s", diskDir, mounts)
	}
	if _, err := os.Stat(img); err == nil {
		t.Errorf("%s after Down", img)
	}
}

// checkRoutes checks that lab addresses and k3s's ranges never route through this machine's
// default route: to the lab's bridges while up, to nowhere after.
func checkRoutes(t *testing.T, defaultDevs []string, up bool) {
	t.Helper()
	for _, tc := range []struct{ addr, upDev string }{
		{"10.77.0.250", privateBridge},
		{"198.51.100.250", publicBridge},
		{"10.42.1.1", ""},
		{"10.43.0.10", ""},
	} {
		out, err := exec.Command("ip", "route", "get", tc.addr).CombinedOutput()
		got := string(out)
		for _, dev := range defaultDevs {
			if strings.Contains(got, " dev "+dev+" ") {
				t.Errorf("%s routes through the default route's %s: %s", tc.addr, dev, got)
			}
		}
		switch {
		case up && tc.upDev != "":
			if err != nil || !strings.Contains(got, " dev "+tc.upDev+" ") {
				t.Errorf("while the lab is up, %s: %s (%v), want dev %s", tc.addr, got, err, tc.upDev)
			}
		case err == nil:
			t.Errorf("%s routes: %s, want unreachable", tc.addr, got)
		}
	}
}

// defaultRouteDevs returns the devices of this machine's default routes.
func defaultRouteDevs(t *testing.T) []string {
	out, err := exec.Command("ip", "-4", "route", "show", "default").Output()
	must(t, err)
	var devs []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		for i := range len(f) - 1 {
			if f[i] == "dev" {
				devs = append(devs, f[i+1])
			}
		}
	}
	return devs
}

// otherLocalAddr returns an IPv4 address of this machine outside loopback and the lab, if any.
func otherLocalAddr(t *testing.T) netip.Addr {
	addrs, err := net.InterfaceAddrs()
	must(t, err)
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() {
			continue
		}
		if !netip.MustParsePrefix(PrivatePrefix).Contains(p.Addr()) && !netip.MustParsePrefix(PublicPrefix).Contains(p.Addr()) {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

func memTotalMiB(t *testing.T) int {
	b, err := os.ReadFile("/proc/meminfo")
	must(t, err)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			must(t, err)
			return kb / 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

// connects reports whether from opens a TCP connection to addr:port within 3 s (bash's
// /dev/tcp: the image has no netcat).
func connects(ctx context.Context, t *testing.T, from *Host, addr netip.Addr, port int) bool {
	t.Helper()
	c, err := from.sshClient(ctx)
	must(t, err)
	script := fmt.Sprintf("exec 3<>/dev/tcp/%s/%d", addr, port)
	res, err := c.Run(ctx, sshx.Command("timeout", "3", "bash", "-c", script))
	must(t, err)
	return res.ExitStatus == 0
}

// systemState returns what `systemctl is-system-running` says and the failed units.
func systemState(ctx context.Context, t *testing.T, h *Host) (string, string) {
	t.Helper()
	state, _ := h.Run(ctx, "systemctl is-system-running")
	failed := run1(ctx, t, h, "systemctl --failed --plain --no-legend")
	return strings.TrimSpace(state), strings.TrimSpace(failed)
}

// run1 runs cmd on h and fails the test if it fails.
func run1(ctx context.Context, t *testing.T, h *Host, cmd string) string {
	t.Helper()
	out, err := h.Run(ctx, cmd)
	if err != nil {
		t.Fatalf("%s: %v", h.Name, err)
	}
	return out
}

// dial returns a connection to h that the test closes at its end.
func dial(ctx context.Context, t *testing.T, h *Host) *sshx.Client {
	t.Helper()
	c, err := sshx.Dial(ctx, h.SSHConfig(h.PublicIP))
	must(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
