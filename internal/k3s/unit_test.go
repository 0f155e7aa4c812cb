package k3s

import (
	"strings"
	"testing"
)

func TestUnit(t *testing.T) {
	for role, want := range map[string]string{"server": "k3s", "agent": "k3s-agent"} {
		name, file, err := Unit(role)
		if err != nil || name != want {
			t.Fatalf("Unit(%s) = %s, %v", role, name, err)
		}
		s := string(file)
		for _, line := range []string{"Type=notify", "KillMode=process", "Restart=always", "ExecStart=/usr/local/bin/k3s " + role,
			"EnvironmentFile=-/etc/systemd/system/" + want + ".service.env", "EnvironmentFile=-/etc/default/%N"} {
			if !strings.Contains(s, line+"\n") {
				t.Errorf("%s unit lacks %q:\n%s", role, line, s)
			}
		}
		if strings.Contains(s, "%!") {
			t.Errorf("formatting error in the %s unit:\n%s", role, s)
		}
	}
	if _, _, err := Unit("etcd"); err == nil {
		t.Error("Unit(etcd) succeeded")
	}
	if UnitPath("k3s") != "/etc/systemd/system/k3s.service" {
		t.Error(UnitPath("k3s"))
	}
}
