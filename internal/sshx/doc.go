// Package sshx is kip's SSH driver: it dials a host once, verifies its host key against kip's own
// known_hosts file, and runs many remote commands over that one connection.
//
// # Settings and their precedence
//
// A Config names a host and how to reach it. Fields the caller sets explicitly (from flags,
// KIP_SSH_KEY or saved cluster settings) always win. Fields left empty are taken from the
// OpenSSH client configuration (Config.SSHConfigPath, ~/.ssh/config by default), where Host may be
// an alias: HostName, User, Port and IdentityFile are read for it. Whatever is still unset gets
// kip's defaults: user root, port 22, a 10 s dial timeout and ~/.kip/known_hosts.
//
// # Authentication
//
// With a key path, that key alone is offered; an encrypted key is unlocked through
// Config.Passphrase (a terminal prompt) or refused with advice to load it into ssh-agent.
// Without one, the keys in ssh-agent (SSH_AUTH_SOCK) are offered.
//
// # Host keys
//
// kip keeps its own known_hosts file. An unknown host is trusted on first use and the operator
// is told so through Config.Notify; a changed host key is refused with both fingerprints.
//
// # Commands
//
// Every remote command is a shell string built with Quote and Command. As any user but root, it
// runs through "sudo -n sh -c". Run checks stop.Check before it starts a command, so an
// operator's stop request takes effect between commands; cancelling the context kills a running
// command's whole process group on the host. A command that was running when the connection
// dropped is never run again: its outcome is unknown and the error says so.
package sshx
