package node

import (
	"errors"
	"strings"
	"testing"

	"kipper.run/kip/internal/cli"
)

func TestAddValidate(t *testing.T) {
	for _, tc := range []struct {
		o    AddOptions
		want string
	}{
		{AddOptions{Host: "203.0.113.11"}, ""},
		{AddOptions{Host: "w1.example.com", PrivateNetwork: "10.0.0.0/16"}, ""},
		{AddOptions{Host: "root@w1"}, `HOST "root@w1": give the host's address or name only`},
		{AddOptions{Host: "w1:2222"}, "give the port with --ssh-port: w1 --ssh-port 2222"},
		{AddOptions{Host: "w1", PrivateNetwork: "10.0.0.0"}, `--private-network "10.0.0.0": give an IPv4 network in CIDR form`},
		{AddOptions{Host: "w1", PrivateNetwork: "10.42.0.0/24"}, "overlaps the cluster's pod or Service network"},
		{AddOptions{Host: "w1", PrivateNetwork: "10.0.0.0/16", Public: true}, "--public and --private-network exclude each other"},
		{AddOptions{Host: "w1", AirgapBundle: "/nonexistent"}, "--airgap-bundle /nonexistent: not a directory"},
	} {
		err := tc.o.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.o, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, new(*cli.UsageError)) {
			t.Errorf("%+v: %v, want a usage error with %q", tc.o, err, tc.want)
		}
	}
}

func TestFlagDifferences(t *testing.T) {
	on, off := true, false
	before := flags{Public: true, Firewall: &off}
	if d := before.differences(flags{Public: true, Firewall: &off}); len(d) != 0 {
		t.Errorf("the same options differ: %q", d)
	}
	got := strings.Join(before.differences(flags{PrivateNetwork: "10.0.0.0/16", Firewall: &on, NoCopies: true}), "; ")
	want := "--private-network: started without it, now with 10.0.0.0/16; --public: started with it, now without it; " +
		"--firewall: started with --firewall=false, now with --firewall; --no-copies: started without it, now with it"
	if got != want {
		t.Errorf("differences:\n%s\nwant:\n%s", got, want)
	}
}

func TestWorkflowName(t *testing.T) {
	for in, want := range map[string]string{"203.0.113.11": "node-add-203.0.113.11", "W1.Example.com": "node-add-w1.example.com", "db_1": "node-add-db-1"} {
		if got := workflowName(in); got != want {
			t.Errorf("workflowName(%s) = %s, want %s", in, got, want)
		}
	}
}
