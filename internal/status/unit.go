package status

import (
	"fmt"
	"strings"

	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/sshx"
)

// JournalLines is how many of a k3s unit's last journal lines doctor and status show when the
// unit is not running; hostchecks.sh asks journalctl for as many.
const JournalLines = 10

// maxJournalLine bounds one journal line as shown: k3s logs long lines.
const maxJournalLine = 400

// Unit is what systemd shows of a k3s unit on a host (systemctl show, journalctl), read over SSH.
type Unit struct {
	// Name is the unit: k3s.service on a server, k3s-agent.service on a worker.
	Name string
	// LoadState is loaded, or not-found when k3s is not installed there.
	LoadState string
	// UnitFileState is enabled or disabled (starts at boot or not).
	UnitFileState string
	// ActiveState is active, activating, deactivating, inactive or failed; SubState refines it
	// (running, dead, auto-restart, …).
	ActiveState string
	SubState    string
	// Result is how the unit last ended: success, exit-code, signal, timeout, …
	Result string
	// ExecMainStatus is the exit status of k3s's last process.
	ExecMainStatus string
	// Restarts is how many times systemd restarted it automatically.
	Restarts string
	// Since is when it entered its state, as systemd prints it.
	Since string
	// Journal is its last journal lines, oldest first.
	Journal []string
	// Error is why its state could not be read (systemctl's own words: no systemd there).
	Error string
}

// unitArg is hostchecks.sh's argument for the k3s unit of a server or a worker.
func unitArg(server bool) string {
	if server {
		return "unit=" + k3s.ServerUnit
	}
	return "unit=" + k3s.AgentUnit
}

// parseUnit reads the "unit NAME" section (systemctl show) and the "journal NAME" one.
func parseUnit(name, show, journal string) *Unit {
	p, other := sshx.Properties(show)
	u := &Unit{Name: name + ".service", LoadState: p["LoadState"], UnitFileState: p["UnitFileState"],
		ActiveState: p["ActiveState"], SubState: p["SubState"], Result: p["Result"],
		ExecMainStatus: p["ExecMainStatus"], Restarts: p["NRestarts"], Since: p["StateChangeTimestamp"]}
	if u.ActiveState == "" {
		u.Error = strings.Join(other, "; ")
		if u.Error == "" {
			u.Error = "systemctl showed nothing"
		}
		return u
	}
	for _, line := range strings.Split(journal, "\n") {
		line = strings.TrimRight(line, " \r")
		if line == "" {
			continue
		}
		if r := []rune(line); len(r) > maxJournalLine {
			line = string(r[:maxJournalLine]) + "…"
		}
		u.Journal = append(u.Journal, line)
	}
	if n := len(u.Journal); n > JournalLines {
		u.Journal = u.Journal[n-JournalLines:]
	}
	return u
}

// Running says the unit is active.
func (u *Unit) Running() bool { return u.ActiveState == "active" }

// installed says systemd knows the unit.
func (u *Unit) installed() bool { return u.LoadState != "not-found" }

// Describe says the unit's state in one sentence: "k3s.service is failed (failed) since …, last
// result exit-code (exit status 1), restarted 5 times, disabled at boot".
func (u *Unit) Describe() string {
	switch {
	case u.Error != "":
		return "cannot read the state of " + u.Name + ": " + u.Error
	case !u.installed():
		return "there is no " + u.Name + " (k3s is not installed there)"
	}
	s := fmt.Sprintf("%s is %s (%s)", u.Name, u.ActiveState, u.SubState)
	if u.Since != "" && u.Since != "n/a" {
		s += " since " + u.Since
	}
	if !u.Running() {
		if u.Result != "" && u.Result != "success" {
			s += ", last result " + u.Result
			if u.ExecMainStatus != "" && u.ExecMainStatus != "0" {
				s += " (exit status " + u.ExecMainStatus + ")"
			}
		}
	}
	if u.Restarts != "" && u.Restarts != "0" {
		s += ", restarted " + u.Restarts + " times"
	}
	if u.UnitFileState == "disabled" {
		s += ", disabled at boot"
	}
	return s
}

// unitFix is how to bring a unit that does not run back, on a server or a worker.
func unitFix(u *Unit, t target) string {
	base := strings.TrimSuffix(u.Name, ".service")
	where := "on the server"
	if !t.server {
		where = "on the worker " + orName(t.node, t.addr)
	}
	start := "systemctl start " + base
	if u.UnitFileState == "disabled" {
		start = "systemctl enable --now " + base
	}
	return fmt.Sprintf("start k3s %s: %s; if it stops again, its log says why: journalctl -u %s -e", where, start, base)
}

// checkUnit judges the k3s unit of one host. apiDown says the API did not answer: a k3s
// server that runs all the same is then worth a warning.
func checkUnit(t target, u *Unit, apiDown bool) Check {
	c := Check{Name: "k3s service", Node: orName(t.node, t.addr), Status: StatusOK, Detail: u.Describe()}
	base := strings.TrimSuffix(u.Name, ".service")
	switch {
	case u.Error != "":
		c.Status = StatusWarn
		c.Fix = "check that systemd runs on the node and that kip may run systemctl there: systemctl status " + base
	case !u.installed():
		c.Status = StatusFail
		if t.server {
			c.Fix = "kip install --host " + t.addr + " installs k3s on the server"
		} else {
			c.Fix = fmt.Sprintf("the worker lost k3s: install k3s-agent on it again, or remove the node (kubectl delete node %s)", orName(t.node, t.addr))
		}
	case u.Running() && apiDown && t.server:
		c.Status = StatusWarn
		c.Detail += ", and the API does not answer"
		c.Fix = "k3s takes up to a minute to serve its API after it starts: run kip doctor again; if the API still does not answer, check that this machine reaches port 6443 of the server (the provider's firewall and the host's), and read k3s's log: journalctl -u k3s -e"
		c.Log = u.Journal
	case u.Running():
	case u.SubState == "auto-restart":
		// k3s's unit restarts it 5 s after it exits: it keeps failing.
		c.Status = StatusFail
		c.Detail += ": k3s keeps exiting and systemd starts it again"
		c.Fix = fmt.Sprintf("its log says why it exits: journalctl -u %s -e; once that is fixed, systemctl restart %s", base, base)
		c.Log = u.Journal
	case u.ActiveState == "activating" || u.ActiveState == "reloading":
		c.Status = StatusWarn
		c.Fix = fmt.Sprintf("wait a minute and run kip doctor again; if it stays %s, read its log: journalctl -u %s -e", u.ActiveState, base)
		c.Log = u.Journal
	default:
		c.Status = StatusFail
		c.Fix = unitFix(u, t)
		c.Log = u.Journal
	}
	return c
}
