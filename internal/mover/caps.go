package mover

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// capability is a Linux capability: its number and its name as a pod's securityContext names it.
type capability struct {
	bit  uint
	name string
}

var (
	capChown       = capability{0, "CHOWN"}           // give each entry its owner and group
	capDACOverride = capability{1, "DAC_OVERRIDE"}    // empty a target whose directories deny writing (--clean)
	capDACReadSrch = capability{2, "DAC_READ_SEARCH"} // read every entry whatever its mode
	capFowner      = capability{3, "FOWNER"}          // set modes, times and attributes of entries owned by others; link their files
	capFsetid      = capability{4, "FSETID"}          // keep setgid on a file whose group root is not in
	capMknod       = capability{27, "MKNOD"}          // recreate device nodes
	capSetfcap     = capability{31, "SETFCAP"}        // copy a file's capabilities (security.capability)
	copyNeeds      = []capability{capChown, capDACOverride, capDACReadSrch, capFowner, capFsetid, capMknod, capSetfcap}
	readNeeds      = []capability{capDACReadSrch}
)

const capsUnread = "read the process's capabilities"

// Capabilities are the capabilities op needs, by the names a container's securityContext uses: the
// copy and verify pods run as root with all others dropped.
func Capabilities(op Op) []string {
	var out []string
	for _, c := range needs(op) {
		out = append(out, c.name)
	}
	return out
}

func needs(op Op) []capability {
	if op == OpCopy {
		return copyNeeds
	}
	return readNeeds
}

// checkCapabilities refuses to start op without the capabilities it needs: without them an entry
// would fail halfway, or an unreadable directory would look empty.
func checkCapabilities(op Op) error {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("%s: %w", capsUnread, err)
	}
	var eff uint64
	found := false
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			if eff, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil {
				return fmt.Errorf("%s: CapEff %q: %w", capsUnread, v, err)
			}
			found = true
		}
	}
	if !found {
		return fmt.Errorf("%s: /proc/self/status has no CapEff", capsUnread)
	}
	var missing []string
	for _, c := range needs(op) {
		if eff&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the %s runs without the capabilities %s it needs (its container's securityContext adds %s)",
			op, strings.Join(missing, ", "), strings.Join(Capabilities(op), ", "))
	}
	return nil
}
