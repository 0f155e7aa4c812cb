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
