package k3s

import (
	"slices"
	"strings"
	"testing"
)

func TestPublicHostAndIssuer(t *testing.T) {
	if got := DexIssuer("203.0.113.10"); got != "https://dex.203.0.113.10.sslip.io" {
		t.Errorf("DexIssuer(ip) = %s", got)
	}
	if got := DexIssuer("k.example.com"); got != "https://dex.k.example.com" {
		t.Errorf("DexIssuer(name) = %s", got)
	}
	cfg, err := AuthenticationConfig("203.0.113.10")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: AuthenticationConfiguration", "apiVersion: apiserver.config.k8s.io/v1", "url: https://dex.203.0.113.10.sslip.io", "claim: email", "prefix: 'oidc:'"} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("authentication config lacks %q:\n%s", want, cfg)
		}
	}
}

// TestJudgeAPIServerArgs: spec 002's cases of a server's kube-apiserver-arg block. A block that
// names every argument keeps its values; none, or kip's own arguments only, is completed; any
// other block that lacks some is the operator's (custom or partial: print the additions, stop).
func TestJudgeAPIServerArgs(t *testing.T) {
	want := KipServer("203.0.113.10", "203.0.113.10", "", FlannelVXLAN).APIServerArgs()
	audit := want[:len(want)-1] // kip's without authentication-config, as written while Dex did not answer
	kipConfig, err := KipServer("203.0.113.10", "203.0.113.10", "", FlannelVXLAN).Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, config  string
		missing       []string
		block, custom bool
		have          int
	}{
		{name: "kip's own", config: string(kipConfig), block: true, have: len(want)},
		{name: "none", config: "node-ip: 10.0.0.1\nflannel-backend: vxlan\n", missing: want},
		{name: "empty file", config: "", missing: want},
		{name: "kip's without login", config: "node-ip: 10.0.0.1\nkube-apiserver-arg:\n  - " + strings.Join(audit, "\n  - ") + "\n",
			block: true, have: len(audit), missing: want[len(want)-1:]},
		{name: "custom values, every name", config: "kube-apiserver-arg:\n  - audit-policy-file=/x\n  - audit-log-path=/y\n  - audit-log-maxsize=5\n  - audit-log-maxbackup=1\n  - audit-log-maxage=2\n  - authentication-config=/z\n  - v=2\n",
			block: true, have: 7},
		{name: "custom, partial", config: "kube-apiserver-arg:\n  - enable-admission-plugins=NodeRestriction\n", block: true, have: 1, missing: want, custom: true},
		{name: "one as a string", config: "kube-apiserver-arg: v=2\n", block: true, have: 1, missing: want, custom: true},
		{name: "kip's, appended", config: "kube-apiserver-arg+:\n  - " + strings.Join(audit, "\n  - ") + "\n", block: true, have: len(audit), missing: want[len(want)-1:], custom: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := JudgeAPIServerArgs([]byte(tc.config), want)
			if err != nil {
				t.Fatal(err)
			}
			if a.Block != tc.block || a.Custom != tc.custom || len(a.Have) != tc.have || !slices.Equal(a.Missing, tc.missing) {
				t.Errorf("got block %v custom %v have %q missing %q; want block %v custom %v have %d missing %q", a.Block, a.Custom, a.Have, a.Missing, tc.block, tc.custom, tc.have, tc.missing)
			}
			if a.Complete() != (len(tc.missing) == 0) {
				t.Errorf("Complete() = %v", a.Complete())
			}
		})
	}
	if _, err := JudgeAPIServerArgs([]byte("kube-apiserver-arg:\n  a: b\n"), want); err == nil {
		t.Error("a mapping as the block was accepted")
	}
	if _, err := JudgeAPIServerArgs([]byte("- a\n"), want); err == nil {
		t.Error("a list as the file was accepted")
	}
}

// TestAddAPIServerArgs: the arguments are added and the rest of the file kept, comments too;
// the result then judges complete.
func TestAddAPIServerArgs(t *testing.T) {
	want := KipServer("203.0.113.10", "203.0.113.10", "", FlannelVXLAN).APIServerArgs()
	for name, config := range map[string]string{
		"none":    "# the operator's note\nnode-ip: 10.0.0.1 # the private address\ntls-san:\n  - k.example.com\n",
		"partial": "# the operator's note\nnode-ip: 10.0.0.1 # the private address\nkube-apiserver-arg:\n  - " + want[0] + "\n",
		"string":  "# the operator's note\nnode-ip: 10.0.0.1 # the private address\nkube-apiserver-arg: " + want[0] + "\n",
		"empty":   "",
	} {
		t.Run(name, func(t *testing.T) {
			a, err := JudgeAPIServerArgs([]byte(config), want)
			if err != nil {
				t.Fatal(err)
			}
			out, err := AddAPIServerArgs([]byte(config), a.Missing)
			if err != nil {
				t.Fatal(err)
			}
			if config != "" {
				for _, keep := range []string{"# the operator's note", "node-ip: 10.0.0.1 # the private address"} {
					if !strings.Contains(string(out), keep) {
						t.Errorf("%q lost:\n%s", keep, out)
					}
				}
			}
			after, err := JudgeAPIServerArgs(out, want)
			if err != nil || !after.Complete() || !slices.Equal(after.Have, want) {
				t.Errorf("after the addition: %+v, %v\n%s", after, err, out)
			}
		})
	}
}

// TestSetFlannelBackend: the backend changed in place (its comment kept) or added, the rest of
// the file as it was.
func TestSetFlannelBackend(t *testing.T) {
	for name, config := range map[string]string{
		"set":   "# the operator's note\nnode-ip: 10.0.0.1\nflannel-backend: vxlan # chosen at install\nkube-apiserver-arg:\n  - v=2\n",
		"unset": "# the operator's note\nnode-ip: 10.0.0.1\n",
	} {
		t.Run(name, func(t *testing.T) {
			out, err := SetFlannelBackend([]byte(config), FlannelWireGuard)
			if err != nil {
				t.Fatal(err)
			}
			if b, err := FlannelBackend(out); err != nil || b != FlannelWireGuard {
				t.Errorf("backend after the change: %q, %v\n%s", b, err, out)
			}
			want := strings.Replace(config, "flannel-backend: vxlan", "flannel-backend: "+FlannelWireGuard, 1)
			if name == "unset" {
				want += "flannel-backend: " + FlannelWireGuard + "\n"
			}
			if string(out) != want {
				t.Errorf("got\n%s\nwant\n%s", out, want)
			}
		})
	}
}

// TestSetNodeAddresses: the server's move onto a private network changes node-ip in place and
// adds node-external-ip; the operator's arguments, comments and the rest stay as they were.
func TestSetNodeAddresses(t *testing.T) {
	config := "# the operator's note\nnode-ip: 203.0.113.10 # public\ntls-san:\n  - 203.0.113.10\nkube-apiserver-arg:\n  - v=2 # mine\n"
	out, err := SetNodeAddresses([]byte(config), "10.77.0.1", "203.0.113.10")
	if err != nil {
		t.Fatal(err)
	}
	want := "# the operator's note\nnode-ip: 10.77.0.1 # public\ntls-san:\n  - 203.0.113.10\nkube-apiserver-arg:\n  - v=2 # mine\nnode-external-ip: 203.0.113.10\n"
	if string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	// A file that has the addresses is kept byte for byte, however the operator formatted it.
	mine := "node-ip: \"10.77.0.1\"\nnode-external-ip:    203.0.113.10\n"
	again, err := SetNodeAddresses([]byte(mine), "10.77.0.1", "203.0.113.10")
	if err != nil || string(again) != mine {
		t.Errorf("a file with the addresses was rewritten: %v\n%s", err, again)
	}
}
