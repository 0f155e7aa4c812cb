// Package host holds kip's knowledge of the operating systems it prepares, as data per OS
// family: which package manager and firewall a host has, which releases kip supports, and
// which cannot run Longhorn; and the host preparation steps kip install and kip node add run:
// packages, kernel modules, sysctls, service hardening and the kip-managed host firewall. Each
// step is a check of the host's real state (…InPlace) and an action that brings it there
// (Apply…, Load…, Install…), after which the check holds. docs/host.md says what they do.
package host

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"kipper.run/kip/internal/sshx"
)

// Family is a group of distributions that kip prepares the same way.
type Family struct {
	Name     string // debian or rhel
	Packages string // apt or dnf
	Firewall string // ufw or firewalld: the firewall kip manages, and its package
	// LonghornPackages are the iSCSI and NFS client packages Longhorn needs.
	LonghornPackages []string

	installed string       // a shell test that package "$p" is installed
	install   string       // a command that installs the packages appended to it, without prompting
	firewall  firewallTool // drives Firewall
}

// The families kip supports.
var (
	Debian = Family{
		Name: "debian", Packages: "apt", Firewall: "ufw",
		LonghornPackages: []string{"open-iscsi", "nfs-common"},
		installed:        `dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed`,
		// A fresh server often has no package lists: refresh them when missing or a day old. A
		// mirror or proxy that stops answering mid-transfer holds apt-get without end (seen in
		// the lab: an update still waiting after 29 minutes), so each update is bounded and tried
		// three times, and the install's downloads are retried.
		install: `export DEBIAN_FRONTEND=noninteractive; ` +
			`if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages' -mtime -1 | head -n 1)" ]; then ` +
			`n=1; until timeout 300 apt-get -o Acquire::Retries=3 update -q; do [ $n -ge 3 ] && exit 1; n=$((n+1)); sleep 5; done; fi; ` +
			`apt-get -o Acquire::Retries=3 install -y -q --no-install-recommends`,
		firewall: ufw{},
	}
	RHEL = Family{
		Name: "rhel", Packages: "dnf", Firewall: "firewalld",
		LonghornPackages: []string{"iscsi-initiator-utils", "nfs-utils"},
		installed:        `rpm -q --quiet "$p"`,
		install:          `dnf install -y -q`,
		firewall:         firewalld{},
	}
)

// release is a supported distribution and the major versions kip supports on it.
type release struct {
	id     string
	name   string
	family Family
	majors []string // VERSION_ID up to the first dot
	// extraModules installs the kernel's modules package that holds iscsi_tcp and nfs, for
	// kernel %s; "" where the kernel's own package has them.
	extraModules string
	// noLonghornFrom is the first 9.x release on which Longhorn's volumes stop attaching
	// (Longhorn issue 13606); "" when none is known.
	noLonghornFrom string
}

var releases = []release{
	{id: "debian", name: "Debian", family: Debian, majors: []string{"12", "13"}},
	{id: "ubuntu", name: "Ubuntu", family: Debian, majors: []string{"22", "24"}, // 22.04 and 24.04 LTS
		extraModules: "apt-get install linux-modules-extra-%s"},
	{id: "rhel", name: "Red Hat Enterprise Linux", family: RHEL, majors: []string{"9", "10"}, extraModules: "dnf install kernel-modules-%s"},
	{id: "rocky", name: "Rocky Linux", family: RHEL, majors: []string{"9", "10"}, extraModules: "dnf install kernel-modules-%s", noLonghornFrom: "9.7"},
	{id: "almalinux", name: "AlmaLinux", family: RHEL, majors: []string{"9", "10"}, extraModules: "dnf install kernel-modules-%s", noLonghornFrom: "9.7"},
	{id: "centos", name: "CentOS Stream", family: RHEL, majors: []string{"9", "10"}, extraModules: "dnf install kernel-modules-%s"},
}

func releaseOf(os sshx.OS) (release, bool) {
	i := slices.IndexFunc(releases, func(r release) bool { return r.id == os.ID })
	if i < 0 {
		return release{}, false
	}
	return releases[i], true
}

// NodeOS is the OS a Node reports (its osImage, the host's PRETTY_NAME) as far as kip's checks
// read it: the ID of a distribution kip supports whose name it starts with and the first word
// after it that is a number ("Rocky Linux 9.7 (Blue Onyx)" is rocky 9.7), else only the pretty
// name.
func NodeOS(osImage string) sshx.OS {
	for _, r := range releases {
		rest, ok := strings.CutPrefix(osImage, r.name+" ")
		if !ok {
			continue
		}
		for _, f := range strings.Fields(rest) { // "Debian GNU/Linux 12 (bookworm)"
			if f[0] >= '0' && f[0] <= '9' {
				return sshx.OS{ID: r.id, VersionID: f, PrettyName: osImage}
			}
		}
	}
	return sshx.OS{PrettyName: osImage}
}

// ExtraModulesCommand is the command that installs the modules package holding iscsi_tcp and
// nfs for kernel on os, "" when there is none to install.
func ExtraModulesCommand(os sshx.OS, kernel string) string {
	if r, ok := releaseOf(os); ok && r.extraModules != "" {
		return fmt.Sprintf(r.extraModules, kernel)
	}
	return ""
}

// Identify returns the family of a supported OS, or an error that names the supported ones.
func Identify(os sshx.OS) (Family, error) {
	major, _, _ := strings.Cut(os.VersionID, ".")
	for _, r := range releases {
		if r.id != os.ID {
			continue
		}
		if slices.Contains(r.majors, major) {
			return r.family, nil
		}
		return Family{}, fmt.Errorf("%s %s is not supported: kip supports %s %s; reinstall the host with a supported release",
			r.name, os.VersionID, r.name, versions(r))
	}
	name := os.PrettyName
	if name == "" {
		name = os.ID
	}
	return Family{}, fmt.Errorf("%s is not supported: kip supports %s", name, supported())
}

func versions(r release) string {
	vs := make([]string, len(r.majors))
	for i, m := range r.majors {
		if r.id == "ubuntu" {
			m += ".04"
		}
		vs[i] = m
	}
	return strings.Join(vs, " and ")
}

func supported() string {
	var s []string
	for _, r := range releases {
		s = append(s, r.name+" "+versions(r))
	}
	return strings.Join(s, ", ")
}

// el9BrokenKernel is the first EL9 kernel with which Longhorn's volumes stop attaching.
const el9BrokenKernel = 611

var el9Kernel = regexp.MustCompile(`^5\.14\.0-(\d+)[.\-_].*el9`)

// WireGuardFix is how a host gets the wireguard module the pod network between nodes runs in.
const WireGuardFix = "boot a kernel with the wireguard module (Linux 5.6 or later has it)"

// MissingStorageModules names the kernel modules Longhorn needs (iscsi_tcp, nfs) that cannot
// load, and how to get them on this OS and kernel; none, "" when all can.
func MissingStorageModules(mods map[string]sshx.ModuleState, os sshx.OS, kernel string) (missing []string, fix string) {
	for _, m := range []string{"iscsi_tcp", "nfs"} {
		if !mods[m].Usable() {
			missing = append(missing, m)
		}
	}
	if len(missing) == 0 {
		return nil, ""
	}
	fix = "boot a kernel that has "
	if cmd := ExtraModulesCommand(os, kernel); cmd != "" {
		fix = fmt.Sprintf("install the kernel modules package for kernel %s (%s), or %s", kernel, cmd, fix)
	}
	return missing, fix + strings.Join(missing, " and ")
}

// LonghornOSFix is what to do about a host CheckLonghorn refuses.
const LonghornOSFix = "keep Longhorn nodes on Rocky Linux or AlmaLinux 9.6 or earlier (a kernel before 5.14.0-611), or move them to version 10, until a Kipper release adopts a fixed Longhorn"

// CheckLonghorn refuses an OS release or kernel where Longhorn's volumes stop attaching (Longhorn
// issue 13606), which no Longhorn release fixes yet. The error says why; LonghornOSFix says what
// to do.
func CheckLonghorn(os sshx.OS, kernel string) error {
	const why = "Longhorn's volumes stop attaching there (Longhorn issue 13606) and no Longhorn release carries a fix yet"
	if r, ok := releaseOf(os); ok && r.noLonghornFrom != "" {
		fromMajor, fromMinor, _ := strings.Cut(r.noLonghornFrom, ".")
		major, minor, _ := strings.Cut(os.VersionID, ".")
		m, err := strconv.Atoi(minor)
		if from, _ := strconv.Atoi(fromMinor); major == fromMajor && err == nil && m >= from {
			return fmt.Errorf("%s %s cannot run Longhorn: %s", r.name, os.VersionID, why)
		}
	}
	if m := el9Kernel.FindStringSubmatch(kernel); m != nil {
		if n, _ := strconv.Atoi(m[1]); n >= el9BrokenKernel {
			return fmt.Errorf("kernel %s (EL9 5.14.0-%d or later) cannot run Longhorn: %s", kernel, el9BrokenKernel, why)
		}
	}
	return nil
}
