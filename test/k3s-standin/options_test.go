package main

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kipper.run/kip/manifests"
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseOptions(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, `
node-name: from-file
token: file-secret
tls-san: a.example,10.0.0.9
kube-apiserver-arg:
  - enable-admission-plugins=NodeRestriction,PodSecurity
write-kubeconfig-mode: 0644
cluster-init: true
disable: [traefik]
some-future-flag: x
server: https://ignored-by-server:6443
`)
	writeFile(t, filepath.Join(dir, "config.yaml.d", "10-more.yaml"), `
disable+: [servicelb]
kube-apiserver-arg+:
  - audit-log-maxage=30
tls-san: b.example
`)
	env := map[string]string{"K3S_CONFIG_FILE": cfg, "K3S_NODE_NAME": "from-env", "K3S_KUBECONFIG_OUTPUT": "/env/k3s.yaml"}
	o, err := parseOptions("server", []string{"--node-name=from-cli", "--tls-san", "c.example", "--unknown-thing", "value", "-d", "/data"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, want string }{
		{"node-name", "from-cli"},             // command line over file over environment
		{"token", "file-secret"},              // file
		{"write-kubeconfig", "/env/k3s.yaml"}, // environment over default
		{"write-kubeconfig-mode", "0644"},
		{"data-dir", "/data"},
		{"bind-address", "0.0.0.0"}, // default
	} {
		if got := o.str(c.name); got != c.want {
			t.Errorf("%s = %q, want %q", c.name, got, c.want)
		}
	}
	if !o.boolean("cluster-init") {
		t.Error("cluster-init not set from the file")
	}
	// The command line's tls-san adds to the files'; config.yaml.d replaced config.yaml's.
	if got, want := o.list("tls-san"), []string{"b.example", "c.example"}; !slices.Equal(got, want) {
		t.Errorf("tls-san = %q, want %q", got, want)
	}
	if got, want := o.list("disable"), []string{"traefik", "servicelb"}; !slices.Equal(got, want) {
		t.Errorf("disable = %q, want %q", got, want)
	}
	if got, want := o.list("kube-apiserver-arg"), []string{"enable-admission-plugins=NodeRestriction,PodSecurity", "audit-log-maxage=30"}; !slices.Equal(got, want) {
		t.Errorf("kube-apiserver-arg = %q, want %q (values with commas kept whole)", got, want)
	}
	warnings := strings.Join(o.warnings, "\n")
	for _, w := range []string{`"some-future-flag"`, `"server"`, "--unknown-thing"} {
		if !strings.Contains(warnings, w) {
			t.Errorf("no warning about %s in:\n%s", w, warnings)
		}
	}
	args := strings.Join(o.nodeArgs, " ")
	if !strings.HasPrefix(args, "server --node-name from-file --token ******** ") || strings.Contains(args, "file-secret") {
		t.Errorf("node args = %s, want the file's settings first, the token redacted", args)
	}
	if strings.Contains(args, "some-future-flag") {
		t.Errorf("node args = %s: unknown file keys are skipped, as k3s skips them", args)
	}
}

func TestParseOptionsErrors(t *testing.T) {
	none := func(string) string { return "" }
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", "/nonexistent/config.yaml"}, "read configuration"},
		{[]string{"--node-name"}, "flag needs an argument: --node-name"},
		{[]string{"positional"}, `unexpected argument "positional"`},
		{[]string{"--cluster-init=maybe"}, "want true or false"},
	} {
		_, err := parseOptions("server", c.args, none)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseOptions(%q) error = %v, want %q", c.args, err, c.want)
		}
	}
}

func TestParseToken(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	for _, c := range []struct {
		in                   string
		hash, user, password string
		err                  string
	}{
		{in: "K10" + hash + "::server:s3cret", hash: hash, user: "server", password: "s3cret"},
		{in: "s3cret", password: "s3cret"},
		{in: "K10" + hash + "::node:a:b", hash: hash, user: "node", password: "a:b"},
		{in: "K10abc::server:x", err: "invalid token CA hash length"},
		{in: "K10" + hash + "::nopassword", err: "invalid token format"},
		{in: "", err: "token must not be empty"},
	} {
		tok, err := parseToken(c.in)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("parseToken(%q) error = %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || tok.caHash != c.hash || tok.user != c.user || tok.password != c.password {
			t.Errorf("parseToken(%q) = %+v, %v", c.in, tok, err)
		}
	}
}

func TestComponentArgs(t *testing.T) {
	got := componentArgs(map[string]string{"secure-port": "6443", "profiling": "false"},
		[]string{"--secure-port=7443", "audit-log-path=/var/log/audit.log", "v"})
	want := []string{"--audit-log-path=/var/log/audit.log", "--profiling=false", "--secure-port=7443", "--v=true"}
	if !slices.Equal(got, want) {
		t.Errorf("componentArgs = %q, want %q", got, want)
	}
}

func TestVersionDefaultsToPin(t *testing.T) {
	pins, err := manifests.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	pin, err := pins.Component("k3s")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := k3sVersion(); err != nil || v != pin.Version {
		t.Errorf("k3sVersion() = %q, %v; want the pin %q", v, err, pin.Version)
	}
	defer func(v string) { version = v }(version)
	version = "1.36"
	if _, err := k3sVersion(); err == nil {
		t.Error("k3sVersion accepted version 1.36")
	}
}

func TestServerConfig(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	for _, f := range append([]string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}, realNodeFiles...) {
		writeFile(t, filepath.Join(bin, f), "")
	}
	writeFile(t, filepath.Join(dir, "config.yaml"), "node-ip: 10.77.0.5\ntls-san: [k3s.example]\n")
	env := map[string]string{"K3S_CONFIG_FILE": filepath.Join(dir, "config.yaml"), "KIP_STANDIN_BIN": bin}
	o, err := parseOptions("server", []string{"--kube-apiserver-arg", "secure-port=7443", "--kube-apiserver-arg=audit-log-path=/x.log", "--data-dir", dir},
		func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	c, err := newServerConfig(o, "v1.37.2+k3s1")
	if err != nil {
		t.Fatal(err)
	}
	// The real kubelet is the default; kwok needs its own files, and nothing else is a kubelet.
	for kubelet, want := range map[string]string{kubeletKwok: "k3s stand-in programs missing", "bogus": `invalid standin-kubelet "bogus"`} {
		env["KIP_STANDIN_KUBELET"] = kubelet
		o, err := parseOptions("server", []string{"--data-dir", dir}, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newServerConfig(o, "v1.37.2+k3s1"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("standin-kubelet %s: %v, want %q", kubelet, err, want)
		}
	}
	delete(env, "KIP_STANDIN_KUBELET")
	args := c.apiserverArgs()
	for _, want := range []string{"--secure-port=7443", "--audit-log-path=/x.log", "--advertise-address=10.77.0.5", "--bind-address=0.0.0.0", "--etcd-servers=http://127.0.0.1:2379"} {
		if !slices.Contains(args, want) {
			t.Errorf("kube-apiserver args lack %s: %q", want, args)
		}
	}
	if slices.Contains(args, "--secure-port=6443") || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--endpoint-reconciler-type") }) {
		t.Errorf("kube-apiserver args: %q", args)
	}
	if c.localURL != "https://127.0.0.1:6443" {
		t.Errorf("local URL %s", c.localURL)
	}
	for _, want := range []string{"10.77.0.5", "10.43.0.1", "127.0.0.1"} {
		if !slices.ContainsFunc(c.sans.ips, func(ip net.IP) bool { return ip.String() == want }) {
			t.Errorf("serving certificate IPs %v lack %s", c.sans.ips, want)
		}
	}
	if !slices.Contains(c.sans.dns, "k3s.example") || !slices.Contains(c.sans.dns, "kubernetes.default.svc") {
		t.Errorf("serving certificate names %v", c.sans.dns)
	}
}
