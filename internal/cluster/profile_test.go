package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestChoose(t *testing.T) {
	tests := []struct {
		name             string
		mem, cpus        int
		profile, storage string
		wantProfile      string
		wantStorage      string
		err              string
	}{
		{"4 GiB server is nano on local", 3936, 2, "", "", "nano", StorageLocal, ""},
		{"one below the edge", 5999, 4, "", "", "nano", StorageLocal, ""},
		{"at the edge", 6000, 2, "", "", "small", StorageLonghorn, ""},
		{"enough RAM, one CPU", 7936, 1, "", "", "nano", StorageLocal, ""},
		{"8 GiB, 2 CPUs", 7936, 2, "", "", "small", StorageLonghorn, ""},
		{"16 GiB, 4 CPUs", 15900, 4, "", "", "standard", StorageLonghorn, ""},
		{"32 GiB, 8 CPUs", 31900, 8, "", "", "large", StorageLonghorn, ""},
		{"--profile nano on a big server", 31900, 8, "nano", "", "nano", StorageLocal, ""},
		{"nano with --storage longhorn at 6000", 6000, 2, "nano", StorageLonghorn, "nano", StorageLonghorn, ""},
		{"--storage longhorn below 6000 refused", 5999, 4, "", StorageLonghorn, "", "", "needs at least 6000 MiB of RAM; this server has 5999 MiB"},
		{"--storage longhorn on 4 GiB refused", 3936, 2, "nano", StorageLonghorn, "", "", "kip cluster storage longhorn"},
		{"--storage local on small", 7936, 2, "", StorageLocal, "small", StorageLocal, ""},
		{"--profile too large refused", 7936, 2, "standard", "", "", "", "choose a smaller profile (--profile small)"},
		{"unknown profile", 7936, 2, "huge", "", "", "", "choose nano, small, standard or large"},
		{"unknown storage", 7936, 2, "", "nfs", "", "", "choose local or longhorn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Choose(tt.mem, tt.cpus, tt.profile, tt.storage)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Choose = %+v, %v; want error containing %q", s, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Profile.Name != tt.wantProfile || s.Storage != tt.wantStorage {
				t.Fatalf("Choose = %s/%s, want %s/%s", s.Profile.Name, s.Storage, tt.wantProfile, tt.wantStorage)
			}
			if s.ProfileReason == "" || s.StorageReason == "" {
				t.Fatalf("no reason given: %+v", s)
			}
		})
	}
}

func TestNanoReasonNamesTheEdge(t *testing.T) {
	s, err := Choose(3936, 2, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.ProfileReason, "3936 MiB") || !strings.Contains(s.ProfileReason, "6000 MiB") {
		t.Fatalf("reason %q does not say why nano", s.ProfileReason)
	}
}

func TestProfilesGrow(t *testing.T) {
	for i := 1; i < len(Profiles); i++ {
		a, b := Profiles[i-1], Profiles[i]
		if b.MinMemoryMiB <= a.MinMemoryMiB || b.MinCPUs <= a.MinCPUs {
			t.Errorf("profile %s does not need more than %s", b.Name, a.Name)
		}
	}
	if Profiles[0].Name != "nano" || Profiles[0].Monitoring || Profiles[1].MinMemoryMiB != LonghornMinMemoryMiB {
		t.Fatal("nano must come first without monitoring, and the next profile must start where Longhorn does")
	}
}

// TestProfilesDoc keeps docs/profiles.md's table in step with Profiles.
func TestProfilesDoc(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "profiles.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Profiles {
		row := fmt.Sprintf("| %s |", p.Name)
		if p.MinMemoryMiB > 0 {
			row += fmt.Sprintf(" %d MiB | %d | on | %s | %s | %s | %s |", p.MinMemoryMiB, p.MinCPUs, p.PrometheusRetention, p.LokiRetention, p.RegistrySize, p.ConsoleAPIMemory)
		} else {
			row += fmt.Sprintf(" — | — | off (`kip platform enable`) | — | — | %s | %s |", p.RegistrySize, p.ConsoleAPIMemory)
		}
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/profiles.md lacks the row %q", row)
		}
	}
}
