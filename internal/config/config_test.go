package config

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestUpdateWritesAtomically0600(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "kip")}
	err := s.Update(func(c *Config) error {
		c.Put(Cluster{Name: "prod", Host: "203.0.113.10", SSHUser: "root", SSHPort: 22, SSHKey: "/k", Kubeconfig: "/kc"})
		c.Current = "prod"
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(s.Dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("config mode %v, want 0600", st.Mode().Perm())
	}
	dst, _ := os.Stat(s.Dir)
	if dst.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v, want 0700", dst.Mode().Perm())
	}
	data, _ := os.ReadFile(filepath.Join(s.Dir, FileName))
	for _, want := range []string{"ssh_key: /k", "ssh_user: root", "current: prod", "host: 203.0.113.10"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("config file lacks %q:\n%s", want, data)
		}
	}
	entries, _ := os.ReadDir(s.Dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
	c, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := c.Cluster("")
	if err != nil || cl.Host != "203.0.113.10" {
		t.Fatalf("Cluster(\"\") = %+v, %v", cl, err)
	}
}

func TestUpdateErrorWritesNothing(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	if err := s.Update(func(c *Config) error { c.Put(Cluster{Name: "a", Host: "h"}); return nil }); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(s.Dir, FileName))
	err := s.Update(func(c *Config) error { c.Put(Cluster{Name: "b", Host: "h"}); return fmt.Errorf("no") })
	if err == nil {
		t.Fatal("want the callback's error")
	}
	after, _ := os.ReadFile(filepath.Join(s.Dir, FileName))
	if string(before) != string(after) {
		t.Fatalf("failed update changed the file:\n%s\n---\n%s", before, after)
	}
}

func TestLoadRejectsUnknownFields(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(s.Dir, FileName), []byte("clusters:\n- name: a\n  hots: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err == nil || !strings.Contains(err.Error(), "hots") {
		t.Fatalf("Load() error = %v, want one naming the unknown field", err)
	}
}

func TestClusterSelection(t *testing.T) {
	none := &Config{}
	if _, err := none.Cluster(""); err == nil || !strings.Contains(err.Error(), "kip install") {
		t.Errorf("empty config: %v", err)
	}
	two := &Config{Clusters: []Cluster{{Name: "a"}, {Name: "b"}}}
	if _, err := two.Cluster(""); err == nil || !strings.Contains(err.Error(), "--cluster") {
		t.Errorf("two clusters, none chosen: %v", err)
	}
	if cl, err := two.Cluster("b"); err != nil || cl.Name != "b" {
		t.Errorf("Cluster(b) = %v, %v", cl, err)
	}
	if _, err := two.Cluster("c"); err == nil || !strings.Contains(err.Error(), "known: a, b") {
		t.Errorf("unknown cluster: %v", err)
	}
}

// TestConcurrentProcessesLoseNothing runs many kip-like processes, each adding its own
// cluster at the same time; every one must be in the file afterwards.
func TestConcurrentProcessesLoseNothing(t *testing.T) {
	dir := t.TempDir()
	const procs = 12
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "KIP_CONFIG_HELPER_DIR="+dir, "KIP_CONFIG_HELPER_N="+strconv.Itoa(i))
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("helper %d: %v: %s", i, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	c, err := Store{Dir: dir}.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Clusters) != procs {
		t.Fatalf("%d clusters in the file, want %d: %+v", len(c.Clusters), procs, c.Clusters)
	}
}

// TestMain runs the binary as one of TestConcurrentProcessesLoseNothing's writers when its
// environment says so.
func TestMain(m *testing.M) {
	if dir := os.Getenv("KIP_CONFIG_HELPER_DIR"); dir != "" {
		n := os.Getenv("KIP_CONFIG_HELPER_N")
		for j := range 5 { // several rounds each, to interleave
			if err := (Store{Dir: dir}).Update(func(c *Config) error {
				c.Put(Cluster{Name: "c" + n, Host: fmt.Sprintf("10.0.0.%s", n), SSHPort: j})
				return nil
			}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
