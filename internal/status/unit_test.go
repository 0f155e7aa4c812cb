package status

import (
	"strings"
	"testing"
)

// showFailed is systemctl show of a k3s unit that stopped after its process exited 1.
const showFailed = `LoadState=loaded
UnitFileState=enabled
ActiveState=failed
SubState=failed
Result=exit-code
ExecMainStatus=1
NRestarts=0
StateChangeTimestamp=Tue 2026-05-05 10:00:00 UTC
`

func TestParseUnitSections(t *testing.T) {
	out := "banner\n@@kip-host clock\n1700000000.5\n@@kip-host unit k3s\n" + showFailed +
		"\n@@kip-host journal k3s\n2026-05-05T10:00:00+0000 srv k3s[42]: level=fatal msg=\"starting kubernetes: preparing server: bootstrap data already found\"\n" +
		"2026-05-05T10:00:00+0000 srv systemd[1]: k3s.service: Main process exited, code=exited, status=1/FAILURE\n"
	p, err := parseProbe(out)
	if err != nil {
		t.Fatal(err)
	}
	u := p.unit
	if u == nil || u.Name != "k3s.service" || u.ActiveState != "failed" || u.Result != "exit-code" || u.ExecMainStatus != "1" || len(u.Journal) != 2 || u.Error != "" {
		t.Fatalf("unit %+v", u)
	}
	if !p.hasClock {
		t.Error("the clock section was lost")
	}
}

func TestCheckUnit(t *testing.T) {
	server := target{node: "srv", addr: "203.0.113.10", server: true}
	worker := target{node: "w1", addr: "203.0.113.11"}
	parse := func(show string) *Unit { return parseUnit("k3s", show, "line 1\nline 2\n") }
	running := strings.NewReplacer("ActiveState=failed", "ActiveState=active", "SubState=failed", "SubState=running", "Result=exit-code", "Result=success", "ExecMainStatus=1", "ExecMainStatus=0").Replace(showFailed)
	crashLoop := strings.NewReplacer("ActiveState=failed", "ActiveState=activating", "SubState=failed", "SubState=auto-restart", "NRestarts=0", "NRestarts=12").Replace(showFailed)
	disabled := strings.NewReplacer("ActiveState=failed", "ActiveState=inactive", "SubState=failed", "SubState=dead", "UnitFileState=enabled", "UnitFileState=disabled").Replace(showFailed)
	tests := []struct {
		name    string
		t       target
		u       *Unit
		apiDown bool
		want    CheckStatus
		detail  string
		fix     string
		log     bool
	}{
		{"stopped", server, parse(showFailed), true, StatusFail,
			"k3s.service is failed (failed) since Tue 2026-05-05 10:00:00 UTC, last result exit-code (exit status 1)",
			"start k3s on the server: systemctl start k3s; if it stops again, its log says why: journalctl -u k3s -e", true},
		{"running", server, parse(running), false, StatusOK, "k3s.service is active (running) since Tue 2026-05-05 10:00:00 UTC", "", false},
		{"running, the API down", server, parse(running), true, StatusWarn, "is active (running) since Tue 2026-05-05 10:00:00 UTC, and the API does not answer", "port 6443", true},
		{"a worker's agent, the API down", worker, parseUnit("k3s-agent", running, ""), true, StatusOK, "k3s-agent.service is active (running)", "", false},
		{"crash loop", server, parse(crashLoop), false, StatusFail, "activating (auto-restart) since Tue 2026-05-05 10:00:00 UTC, last result exit-code (exit status 1), restarted 12 times: k3s keeps exiting",
			"journalctl -u k3s -e; once that is fixed, systemctl restart k3s", true},
		{"disabled", worker, parseUnit("k3s-agent", disabled, ""), false, StatusFail, "k3s-agent.service is inactive (dead) since Tue 2026-05-05 10:00:00 UTC, last result exit-code (exit status 1), disabled at boot",
			"start k3s on the worker w1: systemctl enable --now k3s-agent", false},
		{"not installed", server, parse("LoadState=not-found\nActiveState=inactive\nSubState=dead\n"), true, StatusFail, "there is no k3s.service", "kip install --host 203.0.113.10", false},
		{"no systemd", server, parse("System has not been booted with systemd as init system (PID 1). Can't operate.\nFailed to connect to bus: Host is down\n"), false, StatusWarn,
			"cannot read the state of k3s.service: System has not been booted with systemd", "systemctl status k3s", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := checkUnit(tt.t, tt.u, tt.apiDown)
			if c.Status != tt.want || !strings.Contains(c.Detail, tt.detail) || !strings.Contains(c.Fix, tt.fix) || (len(c.Log) > 0) != tt.log {
				t.Errorf("%s %q fix %q log %q", c.Status, c.Detail, c.Fix, c.Log)
			}
			if c.Status != StatusOK && c.Fix == "" {
				t.Error("no fix")
			}
		})
	}
}

func TestParseUnitKeepsTheLastLines(t *testing.T) {
	var journal strings.Builder
	for i := range 15 {
		journal.WriteString(strings.Repeat("x", 500) + string(rune('a'+i)) + "\n")
	}
	u := parseUnit("k3s", showFailed, journal.String())
	if len(u.Journal) != JournalLines || !strings.HasSuffix(u.Journal[0], "…") || len([]rune(u.Journal[0])) != maxJournalLine+1 {
		t.Fatalf("%d lines, the first %d runes", len(u.Journal), len([]rune(u.Journal[0])))
	}
}
