// Package fault lets a test build of kip stop after any single write it makes. A write is each
// mutating Kubernetes API request the server accepted (create, update, patch, delete, eviction;
// dry runs and access reviews excluded) and each remote command that may change a host (sshx
// counts every command but those run through Client.Query). Writes are numbered from 1 in the
// order they end.
//
// A binary built with -tags kipfault:
//
//   - with KillWriteEnv (KIP_FAULT_KILL_WRITE) set to N, kills itself with SIGKILL right after
//     its Nth write ended, before kip sees the result: the server made the change, kip never
//     learned it;
//   - with KillWriteMatchingEnv (KIP_FAULT_KILL_WRITE_MATCHING) set to a regular expression,
//     kills itself the same way right after the first write whose description (below) matches
//     it: a test that resumes a workflow stops each run at the write it names, whatever the
//     writes before it in that run;
//   - with WritesFileEnv (KIP_FAULT_WRITES) naming a file, appends a line to it for each write:
//     its number, a tab and what it was ("API PATCH /api/v1/persistentvolumes/pv-1",
//     "ssh root@10.0.0.1:22: rm -rf -- /var/lib/x");
//   - with KillNewWriteEnv (KIP_FAULT_KILL_NEW_WRITE) naming a file, kills itself right after its
//     first write that no earlier run given the same file made, and adds it there: run again
//     and again, each run resumes where the one before it was killed and is killed after the
//     next write, until one ends by itself — every write of a workflow killed after in turn,
//     each state resumed, in one pass. A write is known by what it was and, for an API request,
//     a digest of its body (a cordon and an uncordon of one node are two writes); writes marked
//     Bookkeeping (the cluster lock, the progress record), which every run makes again, are
//     never the one killed after.
//
// A test runs a workflow once with the file to count its writes, then once per write killed
// after it, and checks that the next run reaches the same end state. The numbering is
// deterministic where kip writes one thing at a time, as its workflows do. Without the tag the
// hooks do nothing; kip as shipped is built without it.
//
// The same build takes how often its waits poll from PollEnv (Interval), and the releases it
// pins from PinEnv (Pinned): it then acts as an earlier kip release that pinned them.
package fault

// The environment variables of a kipfault build (see the package documentation).
const (
	KillWriteEnv         = "KIP_FAULT_KILL_WRITE"
	KillWriteMatchingEnv = "KIP_FAULT_KILL_WRITE_MATCHING"
	WritesFileEnv        = "KIP_FAULT_WRITES"
	KillNewWriteEnv      = "KIP_FAULT_KILL_NEW_WRITE"
	// PollEnv (a Go duration) replaces how often kip's waits ask again (kube.PollInterval), so
	// that a test which runs a workflow once per write spends its time on the writes, not on
	// half-second polls. What a wait waits for is the same at any interval.
	PollEnv = "KIP_FAULT_POLL_INTERVAL"
	// PinEnv (name=version, comma-separated, e.g. k3s=v1.36.3+k3s1) replaces the versions this
	// kip pins (manifests/versions.yaml) of the components it names, without a checksum: a test
	// builds with it the cluster an earlier kip release installed, for the upgrade to move.
	PinEnv = "KIP_FAULT_PIN"
)
