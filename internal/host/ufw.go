package host

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"kipper.run/kip/internal/sshx"
)

// ufwState is what `ufw status verbose` and `ufw show added` say.
type ufwState struct {
	installed, active, managed bool
	incoming                   string   // the default incoming policy: deny, reject or allow; "" when not shown
	kip                        []string // kip's rules, as ufw show added prints them after "ufw "
	added                      []string // every rule so, without its comment
}

// ufwComment ends every rule kip adds, as ufw show added prints it.
const ufwComment = " comment '" + FirewallMarker + "'"

// parseUFW parses the output of ufw status (verbose or not) and ufw show added; empty output
// means ufw is not installed. A rule whose comment is FirewallMarker, in either, makes ufw
// kip-managed: ufw status lists rules only while ufw is active, ufw show added always.
func parseUFW(status, added string) (ufwState, error) {
	var u ufwState
	if ls := sshx.Lines(status); len(ls) > 0 {
		state, ok := strings.CutPrefix(ls[0], "Status:")
		if !ok {
			return ufwState{}, fmt.Errorf("unexpected first line %q", ls[0])
		}
		switch strings.TrimSpace(state) {
		case "active":
			u.active = true
		case "inactive":
		default:
			return ufwState{}, fmt.Errorf("unexpected status %q", ls[0])
		}
		u.installed = true
		for _, l := range ls[1:] {
			if d, ok := strings.CutPrefix(l, "Default:"); ok {
				for _, policy := range strings.Split(d, ",") {
					if p, ok := strings.CutSuffix(strings.TrimSpace(policy), " (incoming)"); ok {
						u.incoming = p
					}
				}
			}
			if _, comment, ok := strings.Cut(l, " # "); ok && strings.TrimSpace(comment) == FirewallMarker {
				u.managed = true
			}
		}
	}
	if ls := sshx.Lines(added); len(ls) > 0 {
		if !strings.HasPrefix(ls[0], "Added user rules") {
			return ufwState{}, fmt.Errorf("unexpected first line %q", ls[0])
		}
		u.installed = true
		for _, l := range ls[1:] {
			if l == "(None)" {
				continue
			}
			rule, ok := strings.CutPrefix(l, "ufw ")
			if !ok {
				return ufwState{}, fmt.Errorf("unexpected rule %q", l)
			}
			if strings.HasSuffix(rule, ufwComment) {
				u.kip = append(u.kip, rule)
				u.managed = true
			}
			bare, _, _ := strings.Cut(rule, " comment '")
			u.added = append(u.added, bare)
		}
	}
	return u, nil
}

// unbound reports whether kip's rules trust the pod or service network on every interface.
func (u ufwState) unbound() bool {
	return slices.ContainsFunc(ufwRules(unbound(PodNetworkRules())), func(args []string) bool {
		return slices.Contains(u.kip, strings.Join(args, " ")+ufwComment)
	})
}

// UfwBlocks returns the commands that make an active ufw that kip does not manage let in what
// rules need, from ufw status verbose and ufw show added: nil when ufw is not active, is kip's,
// lets traffic in by default, or already allows each rule as kip would write it or wider ("allow
// 6443" covers 6443/tcp, "allow from 10.42.0.0/16" covers "allow in on cni0 from 10.42.0.0/16").
func UfwBlocks(ufwStatus, ufwAdded string, rules []Rule) ([]string, error) {
	u, err := parseUFW(ufwStatus, ufwAdded)
	if err != nil || !u.active || u.managed || u.incoming == "allow" {
		return nil, err
	}
	var cmds []string
	for _, args := range ufwRules(rules) {
		if !slices.ContainsFunc(ufwCovering(args), func(line string) bool { return slices.Contains(u.added, line) }) {
			cmds = append(cmds, sshx.Command("ufw", args...))
		}
	}
	return cmds, nil
}

// ufwCovering returns the rules, as ufw show added prints them without the comment, that let in
// at least what the rule args (one of ufwRules) does: itself, the rule on any interface, and a
// port on any protocol.
func ufwCovering(args []string) []string {
	lines := []string{strings.Join(args, " ")}
	if len(args) > 3 && args[1] == "in" && args[2] == "on" {
		args = append([]string{args[0]}, args[4:]...)
		lines = append(lines, strings.Join(args, " "))
	}
	if port, _, ok := strings.Cut(args[len(args)-1], "/"); ok && len(args) == 2 {
		lines = append(lines, args[0]+" "+port)
	}
	return lines
}

// ufw drives ufw.
type ufw struct{}

// ufwRules returns the ufw arguments that add rules, each once, in the form ufw show added
// prints them back (without the comment): "allow 22/tcp", "allow in on cni0 from 10.42.0.0/16",
// "allow from 10.0.0.2 to any port 51820 proto udp". A rule bound to interfaces is one per
// source and interface. Rules without sources hold for IPv4 and IPv6.
func ufwRules(rules []Rule) [][]string {
	var out [][]string
	add := func(args ...string) {
		if !slices.ContainsFunc(out, func(a []string) bool { return slices.Equal(a, args) }) {
			out = append(out, args)
		}
	}
	for _, r := range rules {
		port := strconv.Itoa(r.Port)
		if len(r.Sources) == 0 {
			add("allow", port+"/"+r.Proto) // validate refuses a rule bound to interfaces without sources
			continue
		}
		ifaces := r.Interfaces
		if len(ifaces) == 0 {
			ifaces = []string{""}
		}
		for _, p := range r.Sources {
			for _, iface := range ifaces {
				args := []string{"allow"}
				if iface != "" {
					args = append(args, "in", "on", iface)
				}
				args = append(args, "from", source(p))
				if r.Port != 0 {
					args = append(args, "to", "any", "port", port, "proto", r.Proto)
				}
				add(args...)
			}
		}
	}
	return out
}

func (ufw) inPlace(p *fwProbe, rules []Rule) bool {
	var want []string
	for _, args := range ufwRules(rules) {
		want = append(want, strings.Join(args, " ")+ufwComment)
	}
	have := slices.Clone(p.ufw.kip)
	slices.Sort(want)
	slices.Sort(have)
	return p.ufw.active && p.ufw.incoming == "deny" && slices.Equal(want, slices.Compact(have))
}

// apply takes an inactive ufw over (reset, default policies, kip's rules, then enable), or
// brings a kip-managed one to the rules: the missing ones first, then the stale ones deleted,
// so that SSH stays open throughout.
func (ufw) apply(p *fwProbe, rules []Rule) (string, []string) {
	cmds := []string{"set -eu", "PATH=$PATH:/usr/sbin:/sbin"}
	run := func(args ...string) { cmds = append(cmds, sshx.Command("ufw", args...)+" >/dev/null") }
	allow := func(args []string) { run(append(slices.Clone(args), "comment", FirewallMarker)...) }
	want := ufwRules(rules)
	if !p.ufw.managed {
		run("--force", "reset")
		run("default", "deny", "incoming")
		run("default", "allow", "outgoing")
		for _, args := range want {
			allow(args)
		}
		run("--force", "enable")
		return strings.Join(cmds, "\n"), nil
	}
	wanted := map[string]bool{}
	for _, args := range want {
		line := strings.Join(args, " ") + ufwComment
		wanted[line] = true
		if !slices.Contains(p.ufw.kip, line) {
			allow(args)
		}
	}
	for _, line := range p.ufw.kip {
		if !wanted[line] {
			run(append([]string{"delete"}, strings.Fields(strings.TrimSuffix(line, ufwComment))...)...)
		}
	}
	if p.ufw.incoming != "deny" {
		run("default", "deny", "incoming")
	}
	if !p.ufw.active {
		run("--force", "enable")
	}
	return strings.Join(cmds, "\n"), nil
}
