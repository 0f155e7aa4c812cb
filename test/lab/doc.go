// Package lab runs kip's test hosts on this machine: real Debian hosts booted by systemd under
// systemd-nspawn, each in its own network namespace with an address on a private bridge
// (10.77.0.0/24) and one on a "public" bridge (198.51.100.0/24, a documentation range, which
// holds the default route), sshd with a generated root key, apt through an apt-cacher-ng that
// the lab runs on the public bridge, sizes (memory, CPUs) chosen per host and, for Longhorn, a
// file system of the host's own at /var/lib/longhorn.
//
// Up brings a lab up and Down removes it; Attach reuses one brought up by `make lab-up`. One lab
// exists at a time: Up waits for another process's lab to go (a lock), and clears a lab left
// behind by a process that died. Everything the lab creates is recorded under /run/kip-lab, host
// disks live under /var/lib/kip-lab, and the base image and the apt cache are kept between runs
// in ${KIP_CACHE_DIR:-~/.cache/kip}/lab.
//
// # Network safety
//
// Packets for the lab's addresses never leave this machine: before anything else exists, Up adds
// unreachable routes for the lab's ranges and for k3s's pod and service ranges (10.42.0.0/16,
// 10.43.0.0/16) in the root namespace, behind the bridges' own routes; Down leaves them in place,
// so that a process still trying a lab address after Down meets an unreachable route, not the
// default route (RemoveRoutes removes them). The root namespace forwards nothing into or out of
// the bridges (an iptables chain drops it, whatever net.ipv4.ip_forward says), drops what hosts
// send to its addresses other than the bridges' own, and does no NAT: hosts reach each other and
// the bridges' addresses (apt-cacher-ng listens on 198.51.100.1), and nothing else.
//
// It needs root, systemd-nspawn, debootstrap, apt-cacher-ng, zstd, iptables and iproute2, and
// e2fsprogs and mount for Longhorn disks (make test-deps installs them).
package lab
