package host

import (
	"strings"
	"testing"

	"kipper.run/kip/internal/sshx"
)

func TestIdentify(t *testing.T) {
	tests := []struct {
		os     sshx.OS
		family string
		err    string
	}{
		{sshx.OS{ID: "debian", VersionID: "12"}, "debian", ""},
		{sshx.OS{ID: "debian", VersionID: "13"}, "debian", ""},
		{sshx.OS{ID: "ubuntu", VersionID: "24.04"}, "debian", ""},
		{sshx.OS{ID: "rocky", VersionID: "9.6"}, "rhel", ""},
		{sshx.OS{ID: "almalinux", VersionID: "10.0"}, "rhel", ""},
		{sshx.OS{ID: "centos", VersionID: "9"}, "rhel", ""},
		{sshx.OS{ID: "debian", VersionID: "11"}, "", "Debian 11 is not supported: kip supports Debian 12 and 13"},
		{sshx.OS{ID: "ubuntu", VersionID: "20.04"}, "", "supports Ubuntu 22.04 and 24.04"},
		{sshx.OS{ID: "arch", PrettyName: "Arch Linux"}, "", "Arch Linux is not supported: kip supports Debian 12 and 13, Ubuntu"},
	}
	for _, tt := range tests {
		t.Run(tt.os.ID+" "+tt.os.VersionID, func(t *testing.T) {
			f, err := Identify(tt.os)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Identify = %v, %v; want error containing %q", f, err, tt.err)
				}
				return
			}
			if err != nil || f.Name != tt.family {
				t.Fatalf("Identify = %v, %v; want family %s", f.Name, err, tt.family)
			}
		})
	}
	if Debian.Firewall != "ufw" || RHEL.Firewall != "firewalld" || Debian.Packages != "apt" || RHEL.Packages != "dnf" {
		t.Fatal("families lost their package manager or firewall")
	}
}

func TestCheckLonghorn(t *testing.T) {
	tests := []struct {
		os     sshx.OS
		kernel string
		err    string
	}{
		{sshx.OS{ID: "rocky", VersionID: "9.6"}, "5.14.0-570.12.1.el9_6.x86_64", ""},
		{sshx.OS{ID: "rocky", VersionID: "9.7"}, "5.14.0-611.5.1.el9_7.x86_64", "Rocky Linux 9.7 cannot run Longhorn"},
		{sshx.OS{ID: "almalinux", VersionID: "9.8"}, "5.14.0-650.el9.x86_64", "AlmaLinux 9.8 cannot run Longhorn"},
		{sshx.OS{ID: "rocky", VersionID: "10.0"}, "6.12.0-55.el10.x86_64", ""},
		{sshx.OS{ID: "centos", VersionID: "9"}, "5.14.0-610.el9.x86_64", ""},
		{sshx.OS{ID: "centos", VersionID: "9"}, "5.14.0-611.el9.x86_64", "EL9 5.14.0-611 or later"},
		{sshx.OS{ID: "rhel", VersionID: "9.6"}, "5.14.0-612.1.1.el9_6.aarch64", "cannot run Longhorn"},
		{sshx.OS{ID: "debian", VersionID: "12"}, "6.1.0-28-amd64", ""},
		{sshx.OS{ID: "ubuntu", VersionID: "24.04"}, "5.14.0-700-generic", ""}, // not an EL9 kernel
	}
	for _, tt := range tests {
		t.Run(tt.os.ID+" "+tt.kernel, func(t *testing.T) {
			err := CheckLonghorn(tt.os, tt.kernel)
			if tt.err == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "13606")) {
				t.Fatalf("err = %v, want one containing %q and the Longhorn issue", err, tt.err)
			}
			// What to do is LonghornOSFix, which each caller adds once.
			if err != nil && strings.Contains(err.Error(), "version 10") {
				t.Errorf("err = %v: the fix belongs to LonghornOSFix alone", err)
			}
		})
	}
}

// TestNodeOS: what a Node reports of its OS (osImage, the host's PRETTY_NAME) read as kip's
// checks need it, so that an upgrade's check of Longhorn's hosts works from the API alone.
func TestNodeOS(t *testing.T) {
	for image, want := range map[string]sshx.OS{
		"Rocky Linux 9.7 (Blue Onyx)":         {ID: "rocky", VersionID: "9.7"},
		"AlmaLinux 9.8 (Moss Jungle Cat)":     {ID: "almalinux", VersionID: "9.8"},
		"Debian GNU/Linux 12 (bookworm)":      {ID: "debian", VersionID: "12"},
		"Arch Linux":                          {},
		"Ubuntu 24.04.1 LTS":                  {ID: "ubuntu", VersionID: "24.04.1"},
		"CentOS Stream 9":                     {ID: "centos", VersionID: "9"},
		"Red Hat Enterprise Linux 9.6 (Plow)": {ID: "rhel", VersionID: "9.6"},
	} {
		got := NodeOS(image)
		if got.ID != want.ID || got.VersionID != want.VersionID || got.PrettyName != image {
			t.Errorf("NodeOS(%q) = %+v, want %+v", image, got, want)
		}
	}
	if err := CheckLonghorn(NodeOS("Rocky Linux 9.7 (Blue Onyx)"), "5.14.0-611.5.1.el9_7.x86_64"); err == nil {
		t.Error("a Node on Rocky Linux 9.7 passed CheckLonghorn")
	}
}
