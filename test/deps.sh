#!/bin/sh
# Installs the Debian packages kip's tests need, when they are missing.
set -eu

missing=""
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
command -v sudo >/dev/null 2>&1 || missing="$missing sudo"
command -v ssh >/dev/null 2>&1 || missing="$missing openssh-client"

if [ -z "$missing" ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "test-deps: missing$missing; install them (as root: apt-get install$missing)" >&2
	exit 1
fi
echo "test-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # the package list is meant to split
apt-get install -y -qq --no-install-recommends $missing
