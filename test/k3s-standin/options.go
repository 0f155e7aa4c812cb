package main

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// kind is how a flag takes values.
type kind int

const (
	kindString kind = iota // the last value given wins
	kindBool               // --flag means true; --flag=false
	kindList               // repeatable, each value split on commas (tls-san, node-ip, disable)
	kindArgs               // repeatable, values kept whole: component arguments hold commas
)

// flagDef is one k3s flag the stand-in understands. Each is also a config.yaml key with the same
// name, and some are read from a K3S_* environment variable as k3s does.
type flagDef struct {
	name, short, env string
	kind             kind
	server, agent    bool
	def              string
	usage            string
}

// The stand-in's own flags (standin-*) are not k3s's: they say where the control-plane binaries
// are and move its loopback ports so that several stand-ins can run on one machine.
var flagDefs = []flagDef{
	{name: "config", short: "c", env: "K3S_CONFIG_FILE", server: true, agent: true, def: "/etc/rancher/k3s/config.yaml", usage: "configuration file"},
	{name: "data-dir", short: "d", env: "K3S_DATA_DIR", server: true, agent: true, def: "/var/lib/rancher/k3s", usage: "state directory"},
	{name: "token", short: "t", env: "K3S_TOKEN", server: true, agent: true, usage: "shared secret used to join agents (server: generated when unset)"},
	{name: "token-file", env: "K3S_TOKEN_FILE", server: true, agent: true, usage: "file holding the token"},
	{name: "node-name", env: "K3S_NODE_NAME", server: true, agent: true, usage: "node name (default: hostname)"},
	{name: "node-ip", short: "i", kind: kindList, server: true, agent: true, usage: "node InternalIP (default: address of the default-route interface)"},
	{name: "node-external-ip", kind: kindList, server: true, agent: true, usage: "node ExternalIP"},
	{name: "node-label", kind: kindList, server: true, agent: true, usage: "label key=value, applied when the Node registers"},
	{name: "node-taint", kind: kindList, server: true, agent: true, usage: "taint key=value:Effect, applied when the Node registers"},
	{name: "kubelet-arg", kind: kindArgs, server: true, agent: true, usage: "kubelet argument: port=N moves the kubelet endpoint, others are recorded only"},
	{name: "kube-proxy-arg", kind: kindArgs, server: true, agent: true, usage: "recorded only: no kube-proxy runs"},
	{name: "flannel-iface", server: true, agent: true, usage: "recorded only: no flannel runs"},
	{name: "server", short: "s", env: "K3S_URL", agent: true, usage: "server to join, https://IP:6443"},
	{name: "bind-address", server: true, def: "0.0.0.0", usage: "kube-apiserver bind address"},
	{name: "https-listen-port", server: true, def: "6443", usage: "kube-apiserver port"},
	{name: "advertise-address", server: true, usage: "address kube-apiserver advertises (default: node-ip)"},
	{name: "tls-san", kind: kindList, server: true, usage: "extra hostname or IP in the serving certificate"},
	{name: "cluster-cidr", server: true, def: "10.42.0.0/16", usage: "Pod network, split into a /24 per Node"},
	{name: "service-cidr", server: true, def: "10.43.0.0/16", usage: "Service network"},
	{name: "service-node-port-range", server: true, def: "30000-32767", usage: "NodePort range"},
	{name: "cluster-init", env: "K3S_CLUSTER_INIT", kind: kindBool, server: true, usage: "label the Node as an etcd member (etcd always runs)"},
	{name: "write-kubeconfig", short: "o", env: "K3S_KUBECONFIG_OUTPUT", server: true, def: "/etc/rancher/k3s/k3s.yaml", usage: "admin kubeconfig path"},
	{name: "write-kubeconfig-mode", env: "K3S_KUBECONFIG_MODE", server: true, usage: "admin kubeconfig mode, octal (default 0600)"},
	{name: "disable", kind: kindList, server: true, usage: "packaged components not to deploy: local-storage (the local-path StorageClass); others are recorded only"},
	{name: "flannel-backend", server: true, def: "vxlan", usage: "recorded in the Nodes' flannel annotations; no flannel runs"},
	{name: "flannel-external-ip", kind: kindBool, server: true, usage: "flannel public-ip annotation from node-external-ip"},
	{name: "kube-apiserver-arg", kind: kindArgs, server: true, usage: "kube-apiserver argument key=value"},
	{name: "kube-controller-manager-arg", kind: kindArgs, server: true, usage: "kube-controller-manager argument key=value"},
	{name: "kube-scheduler-arg", kind: kindArgs, server: true, usage: "kube-scheduler argument key=value"},
	{name: "etcd-arg", kind: kindArgs, server: true, usage: "etcd argument key=value"},
	{name: "standin-bin-dir", env: "KIP_STANDIN_BIN", server: true, agent: true, def: "/opt/kip-testenv", usage: "stand-in only: directory of etcd, kube-*, kubelet, kube-proxy, containerd, ctr, kwok, kwok-stages/; its subdirectory named for the claimed release's Kubernetes (v1.36.3 for v1.36.3+k3s1) instead, when it has one"},
	{name: "standin-kubelet", env: "KIP_STANDIN_KUBELET", server: true, agent: true, def: kubeletReal, usage: "stand-in only: real (containerd, kubelet and kube-proxy run pods) or kwok (kwok plays the kubelet; nothing runs)"},
	{name: "standin-port-base", env: "KIP_STANDIN_PORT_BASE", server: true, def: "0", usage: "stand-in only: put etcd, its peer port, controller-manager and scheduler on N..N+3 instead of 2379, 2380, 10257, 10259"},
}

// options are a command's settings resolved as k3s resolves them: defaults, then K3S_*
// environment variables, then the configuration files, then the command line.
type options struct {
	cmd    string
	defs   map[string]*flagDef
	values map[string][]string
	// nodeArgs is the command with its configuration-file arguments and command line, secrets
	// redacted: k3s's k3s.io/node-args annotation.
	nodeArgs []string
	// warnings are the keys and flags the stand-in does not implement, for the log.
	warnings []string
}

func defsFor(cmd string) map[string]*flagDef {
	m := map[string]*flagDef{}
	for i := range flagDefs {
		d := &flagDefs[i]
		if (cmd == "server" && d.server) || (cmd == "agent" && d.agent) {
			m[d.name] = d
			if d.short != "" {
				m[d.short] = d
			}
		}
	}
	return m
}

// parseOptions resolves cmd's settings from cli (the arguments after the command) and the
// environment.
func parseOptions(cmd string, cli []string, getenv func(string) string) (*options, error) {
	o := &options{cmd: cmd, defs: defsFor(cmd), values: map[string][]string{}}
	for _, d := range o.defs {
		if d.def != "" {
			o.values[d.name] = []string{d.def}
		}
		if d.env != "" && getenv(d.env) != "" {
			o.values[d.name] = []string{getenv(d.env)}
		}
	}
	path, explicit := o.values["config"][0], getenv("K3S_CONFIG_FILE") != ""
	if p, ok := findConfigFlag(cli); ok {
		path, explicit = p, true
	}
	fileArgs, err := o.readConfig(path, explicit)
	if err != nil {
		return nil, err
	}
	args := append(fileArgs, cli...)
	given := map[string]bool{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			return nil, fmt.Errorf("unexpected argument %q", a)
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		d := o.defs[name]
		if d == nil {
			if !hasVal && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++ // neither command takes positional arguments: this is the flag's value
			}
			o.warnings = append(o.warnings, fmt.Sprintf("flag --%s is not implemented by the k3s stand-in; ignored", name))
			continue
		}
		switch {
		case d.kind == kindBool && !hasVal:
			val = "true"
		case d.kind == kindBool:
			if _, err := strconv.ParseBool(val); err != nil {
				return nil, fmt.Errorf("invalid value %q for --%s: want true or false", val, d.name)
			}
		case !hasVal:
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag needs an argument: --%s", d.name)
			}
			i++
			val = args[i]
		}
		if (d.kind == kindList || d.kind == kindArgs) && given[d.name] {
			o.values[d.name] = append(o.values[d.name], val)
		} else {
			o.values[d.name] = []string{val}
		}
		given[d.name] = true
	}
	o.nodeArgs = redactArgs(append([]string{cmd}, args...))
	return o, nil
}

// findConfigFlag returns the value of -c/--config on the command line.
func findConfigFlag(cli []string) (string, bool) {
	for i, a := range cli {
		for _, f := range []string{"-c", "--config"} {
			if a == f && i+1 < len(cli) {
				return cli[i+1], true
			}
			if v, ok := strings.CutPrefix(a, f+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}

// configEntry is one key of the merged configuration files.
type configEntry struct {
	key    string
	values []string
}

// readConfig reads path and then path.d/*.yaml in name order, as k3s does: a later file's key
// replaces an earlier one's, and "key+:" appends to it. It returns the settings as arguments
// (--key=value, one per list item), in the files' order, skipping keys that are not flags of
// this command.
func (o *options) readConfig(path string, explicit bool) ([]string, error) {
	files := []string{path}
	more, err := filepath.Glob(filepath.Join(path+".d", "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("list %s.d: %w", path, err)
	}
	sort.Strings(more)
	files = append(files, more...)
	var entries []*configEntry
	index := map[string]*configEntry{}
	for i, f := range files {
		data, err := os.ReadFile(f)
		if i == 0 && errors.Is(err, fs.ErrNotExist) && !explicit {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read configuration: %w", err)
		}
		pairs, err := parseConfigFile(data)
		if err != nil {
			return nil, fmt.Errorf("read configuration %s: %w", f, err)
		}
		for _, p := range pairs {
			key, appendTo := strings.CutSuffix(p.key, "+")
			if e, ok := index[key]; ok {
				if appendTo {
					e.values = append(e.values, p.values...)
				} else {
					e.values = p.values
				}
				continue
			}
			e := &configEntry{key: key, values: p.values}
			index[key] = e
			entries = append(entries, e)
		}
	}
	var args []string
	for _, e := range entries {
		d := o.defs[e.key]
		if d == nil || d.name != e.key {
			o.warnings = append(o.warnings, fmt.Sprintf("configuration key %q is not implemented by the k3s stand-in for %s; ignored", e.key, o.cmd))
			continue
		}
		for _, v := range e.values {
			args = append(args, "--"+e.key+"="+v)
		}
	}
	return args, nil
}

// parseConfigFile returns a YAML mapping's keys in order, each with its scalar value or list of
// scalars.
func parseConfigFile(data []byte) ([]configEntry, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, nil // empty file
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("want a mapping of flag names to values")
	}
	var out []configEntry
	for i := 0; i+1 < len(m.Content); i += 2 {
		key, val := m.Content[i].Value, m.Content[i+1]
		e := configEntry{key: key}
		switch val.Kind {
		case yaml.ScalarNode:
			e.values = []string{val.Value}
		case yaml.SequenceNode:
			for _, item := range val.Content {
				if item.Kind != yaml.ScalarNode {
					return nil, fmt.Errorf("key %q: list items must be scalars", key)
				}
				e.values = append(e.values, item.Value)
			}
		default:
			return nil, fmt.Errorf("key %q: want a scalar or a list of scalars", key)
		}
		out = append(out, e)
	}
	return out, nil
}

func (o *options) str(name string) string {
	v := o.values[name]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func (o *options) boolean(name string) bool {
	b, _ := strconv.ParseBool(o.str(name)) // validated when parsed
	return b
}

func (o *options) integer(name string) (int, error) {
	n, err := strconv.Atoi(o.str(name))
	if err != nil {
		return 0, fmt.Errorf("invalid value %q for --%s: want a number", o.str(name), name)
	}
	return n, nil
}

// list returns a repeatable flag's values; those of comma-separated flags split.
func (o *options) list(name string) []string {
	var out []string
	for _, v := range o.values[name] {
		if o.defs[name].kind == kindArgs {
			out = append(out, v)
			continue
		}
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// tokenValue returns --token, else the contents of --token-file.
func (o *options) tokenValue() (string, error) {
	if t := o.str("token"); t != "" {
		return t, nil
	}
	if f := o.str("token-file"); f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("read token file: %w", err)
		}
		return strings.TrimSpace(string(data)), nil
	}
	return "", nil
}

// secretArgs are the flags and environment variables whose values k3s redacts in its node
// annotations.
var secretArgs = map[string]bool{
	"--token": true, "-t": true, "--agent-token": true, "--datastore-endpoint": true,
	"--cluster-secret": true, "--etcd-s3-access-key": true, "--etcd-s3-secret-key": true,
	"K3S_TOKEN": true, "K3S_AGENT_TOKEN": true, "K3S_DATASTORE_ENDPOINT": true,
	"K3S_CLUSTER_SECRET": true, "AWS_ACCESS_KEY_ID": true, "AWS_SECRET_ACCESS_KEY": true,
}

const redacted = "********"

// redactArgs splits --flag=value arguments in two and redacts secret values, as k3s does for its
// k3s.io/node-args annotation.
func redactArgs(args []string) []string {
	var out []string
	for _, a := range args {
		if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "--") {
			out = append(out, name, val)
			continue
		}
		out = append(out, a)
	}
	for i := 0; i+1 < len(out); i++ {
		if secretArgs[out[i]] {
			out[i+1] = redacted
		}
	}
	return out
}

// nodeConfigAnnotations returns k3s's k3s.io/node-args, k3s.io/node-env and
// k3s.io/node-config-hash annotations.
func (o *options) nodeConfigAnnotations(environ []string) (map[string]string, error) {
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "K3S_") {
			if secretArgs[k] {
				v = redacted
			}
			env[k] = v
		}
	}
	args, err := json.Marshal(o.nodeArgs)
	if err != nil {
		return nil, fmt.Errorf("encode node args: %w", err)
	}
	envJSON, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("encode node env: %w", err)
	}
	sum := sha256.Sum256(append(args, envJSON...))
	return map[string]string{
		"k3s.io/node-args":        string(args),
		"k3s.io/node-env":         string(envJSON),
		"k3s.io/node-config-hash": base32.StdEncoding.EncodeToString(sum[:]),
	}, nil
}
