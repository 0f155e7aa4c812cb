// Package cluster is the model of a Kipper cluster that every area of kip reads: the cluster
// record (what install decided and installed), the record of the workers kip joined (Nodes),
// the sizing profiles, and the storage, network and backup modes. It holds no workflow; install, status, platform and the storage, node and
// upgrade areas import it rather than each other.
package cluster

import (
	"fmt"
	"slices"
)

// Storage modes. A cluster's mode only ever moves from local to Longhorn.
const (
	StorageLocal    = "local"
	StorageLonghorn = "longhorn"
)

// LonghornMinMemoryMiB is the least RAM (MemTotal) on which kip runs Longhorn.
const LonghornMinMemoryMiB = 6000

// Profile sizes a cluster for its server. docs/profiles.md shows this table.
type Profile struct {
	Name         string `json:"name"`
	MinMemoryMiB int    `json:"minMemoryMiB"` // MemTotal the server needs, as /proc/meminfo reports it
	MinCPUs      int    `json:"minCPUs"`
	// Monitoring turns Prometheus, Loki and Grafana on at install.
	Monitoring bool `json:"monitoring"`
	// PrometheusRetention and LokiRetention are how long metrics and logs are kept.
	PrometheusRetention string `json:"prometheusRetention,omitempty"`
	LokiRetention       string `json:"lokiRetention,omitempty"`
	// RegistrySize is the Zot registry's volume.
	RegistrySize string `json:"registrySize"`
	// ConsoleAPIMemory is console-api's memory limit.
	ConsoleAPIMemory string `json:"consoleAPIMemory"`
}

// ProfileNano is the smallest profile's name: one small server on local storage.
const ProfileNano = "nano"

// Profiles, smallest first. Nano fits any server kip supports; a larger one needs its minimums.
var Profiles = []Profile{
	{Name: ProfileNano, Monitoring: false, RegistrySize: "10Gi", ConsoleAPIMemory: "256Mi"},
	{Name: "small", MinMemoryMiB: LonghornMinMemoryMiB, MinCPUs: 2, Monitoring: true,
		PrometheusRetention: "3d", LokiRetention: "3d", RegistrySize: "20Gi", ConsoleAPIMemory: "384Mi"},
	{Name: "standard", MinMemoryMiB: 14000, MinCPUs: 4, Monitoring: true,
		PrometheusRetention: "15d", LokiRetention: "7d", RegistrySize: "50Gi", ConsoleAPIMemory: "512Mi"},
	{Name: "large", MinMemoryMiB: 30000, MinCPUs: 8, Monitoring: true,
		PrometheusRetention: "30d", LokiRetention: "14d", RegistrySize: "100Gi", ConsoleAPIMemory: "1Gi"},
}

// ProfileNamed returns the profile called name.
func ProfileNamed(name string) (Profile, error) {
	i := slices.IndexFunc(Profiles, func(p Profile) bool { return p.Name == name })
	if i < 0 {
		return Profile{}, fmt.Errorf("unknown profile %q: choose %s", name, profileNames())
	}
	return Profiles[i], nil
}

func profileNames() string {
	s := ""
	for i, p := range Profiles {
		switch {
		case i == len(Profiles)-1:
			s += " or "
		case i > 0:
			s += ", "
		}
		s += p.Name
	}
	return s
}

// Sizing is what install chose for a server, and why, in words it prints.
type Sizing struct {
	Profile       Profile
	Storage       string
	ProfileReason string
	StorageReason string
}

// Choose picks the profile and storage for a server with memMiB of MemTotal and cpus CPUs. An
// empty profile or storage picks the default: the largest profile the server meets, and local
// storage on nano, Longhorn otherwise. A choice the server cannot carry is refused with the fix.
func Choose(memMiB, cpus int, profile, storage string) (Sizing, error) {
	var s Sizing
	if profile != "" {
		p, err := ProfileNamed(profile)
		if err != nil {
			return s, err
		}
		if memMiB < p.MinMemoryMiB || cpus < p.MinCPUs {
			return s, fmt.Errorf("the %s profile needs at least %d MiB of RAM and %d CPUs; this server has %d MiB and %d: resize the server, or choose a smaller profile (--profile %s)",
				p.Name, p.MinMemoryMiB, p.MinCPUs, memMiB, cpus, largestFor(memMiB, cpus).Name)
		}
		s.Profile, s.ProfileReason = p, fmt.Sprintf("asked for with --profile %s", p.Name)
	} else {
		s.Profile = largestFor(memMiB, cpus)
		s.ProfileReason = fmt.Sprintf("the largest profile for %d MiB of RAM and %s", memMiB, cpuCount(cpus))
		if s.Profile.Name == ProfileNano {
			next := Profiles[1]
			s.ProfileReason = fmt.Sprintf("%d MiB of RAM and %s is below the %d MiB and %s of the %s profile",
				memMiB, cpuCount(cpus), next.MinMemoryMiB, cpuCount(next.MinCPUs), next.Name)
		}
	}

	switch storage {
	case "":
		if s.Profile.Name == ProfileNano {
			s.Storage, s.StorageReason = StorageLocal, "the nano profile keeps volumes on the server's own disk; pass --storage longhorn on a server with at least 6000 MiB for Longhorn"
		} else {
			s.Storage, s.StorageReason = StorageLonghorn, fmt.Sprintf("the %s profile's default", s.Profile.Name)
		}
	case StorageLonghorn:
		if memMiB < LonghornMinMemoryMiB {
			return s, fmt.Errorf("--storage longhorn needs at least %d MiB of RAM; this server has %d MiB: resize the server, or install with local storage (omit --storage) and switch later with 'kip cluster storage longhorn'",
				LonghornMinMemoryMiB, memMiB)
		}
		s.Storage, s.StorageReason = StorageLonghorn, "asked for with --storage longhorn"
	case StorageLocal:
		s.Storage, s.StorageReason = StorageLocal, "asked for with --storage local"
	default:
		return s, fmt.Errorf("unknown storage %q: choose local or longhorn", storage)
	}
	return s, nil
}

// cpuCount says "1 CPU" or "n CPUs".
func cpuCount(n int) string {
	if n == 1 {
		return "1 CPU"
	}
	return fmt.Sprintf("%d CPUs", n)
}

// largestFor returns the largest profile whose minimums the server meets.
func largestFor(memMiB, cpus int) Profile {
	best := Profiles[0]
	for _, p := range Profiles {
		if memMiB >= p.MinMemoryMiB && cpus >= p.MinCPUs {
			best = p
		}
	}
	return best
}
