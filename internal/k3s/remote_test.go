package k3s

import "testing"

func TestParseVersion(t *testing.T) {
	for out, want := range map[string]string{
		"k3s version v1.37.2+k3s1 (abc123)\ngo version go1.26.8\n": "v1.37.2+k3s1",
		"":                               "",
		"bash: k3s: command not found\n": "",
		"k3s version\n":                  "",
	} {
		if got := ParseVersion(out); got != want {
			t.Errorf("ParseVersion(%q) = %q, want %q", out, got, want)
		}
	}
}

func TestCheckPinned(t *testing.T) {
	b := BinaryInstall{Version: "v1.37.2+k3s1", Pinned: "ABCD"}
	if err := b.CheckPinned("abcd"); err != nil {
		t.Errorf("the pinned checksum in another case: %v", err)
	}
	want := "the k3s v1.37.2+k3s1 binary has SHA-256 ef01, but this kip pins ABCD: refusing it"
	if err := b.CheckPinned("ef01"); err == nil || err.Error() != want {
		t.Errorf("another checksum: %v, want %q", err, want)
	}
	if err := (BinaryInstall{Version: "v1.36.1+k3s1"}).CheckPinned("ef01"); err != nil {
		t.Errorf("no pin: %v", err)
	}
}
