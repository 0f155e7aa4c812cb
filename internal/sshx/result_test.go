package sshx

import (
	"strings"
	"testing"
)

func TestResultErr(t *testing.T) {
	long := strings.Repeat("x", 70)
	for _, tc := range []struct {
		res  Result
		want string
	}{
		{Result{Command: "true"}, ""},
		{Result{Command: "false", ExitStatus: 1}, `command "false" exited 1`},
		{Result{Command: "apt-get install -y foo", ExitStatus: 100, Stderr: []byte("Reading...\nE: Unable to locate package foo\n\n"), host: "root@h:22"},
			`ssh root@h:22: command "apt-get install -y foo" exited 100: E: Unable to locate package foo`},
		{Result{Command: long, ExitStatus: 137}, `command "` + long[:60] + `…" exited 137`},
	} {
		got := ""
		if err := tc.res.Err(); err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("Err() = %q, want %q", got, tc.want)
		}
	}
}

func TestShort(t *testing.T) {
	if got := short(strings.Repeat("é", 61)); got != strings.Repeat("é", 60)+"…" {
		t.Errorf("short cut %q", got)
	}
	if got := short("ok"); got != "ok" {
		t.Errorf("short(ok) = %q", got)
	}
}

func TestProperties(t *testing.T) {
	p, rest := Properties("ActiveState=active\nInvocationID=\n\nFailed to connect to bus: No such file or directory\nExecMainStatus=0\n")
	if p["ActiveState"] != "active" || p["ExecMainStatus"] != "0" || len(p) != 3 || p["InvocationID"] != "" {
		t.Errorf("properties %v", p)
	}
	if len(rest) != 1 || rest[0] != "Failed to connect to bus: No such file or directory" {
		t.Errorf("rest %q", rest)
	}
}
