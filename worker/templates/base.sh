#!/bin/sh
# Builds the "base" template into DIR, an empty writable btrfs subvolume that the worker then
# snapshots read-only: Debian bookworm minbase with bash, coreutils, iproute2, curl,
# ca-certificates, python3 (also as `python`), git and sudo, the statx shim in
# /etc/ld.so.preload (runtime-notes.md: GNU coreutils fail under this runsc without it), and
# user "user" (uid 1000) with /home/user, who may sudo without a password. What E2B's own
# `base` carries that its SDK tests use (git, sudo, python): issue 19.
#
# Usage: base.sh DIR STATX_SHIM_C [MIRROR]
# MIRROR defaults to the Debian archive this host's apt uses (/etc/apt/sources.list{,.d}).
# Needs root, debootstrap and gcc. Takes minutes.
set -eu

dir=$1
shim=$2
mirror=${3:-}

# Every archive URL the host's apt configuration names, deb822 (.sources) and one-line (.list).
apt_uris() {
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; break } }' "$f"
    done
}

if [ -z "$mirror" ]; then
    mirror=$(apt_uris | grep -E '^(https?|file)://.*/debian/?$' | head -n 1 || true)
fi
if [ -z "$mirror" ]; then
    echo "base.sh: no Debian mirror found in /etc/apt; pass one as the third argument" >&2
    exit 1
fi
echo "base.sh: mirror $mirror"

debootstrap --variant=minbase \
    --include=bash,coreutils,iproute2,curl,ca-certificates,python3,python-is-python3,git,sudo \
    bookworm "$dir" "$mirror"

chroot "$dir" useradd --create-home --uid 1000 --user-group --shell /bin/bash user
# E2B's user may become root: passwordless sudo.
echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' >"$dir/etc/sudoers.d/user"
chmod 0440 "$dir/etc/sudoers.d/user"
# debootstrap copied this host's name; the sandbox's own is its UTS name (the sandbox id, set
# by the worker), which /etc/hosts resolves through "localhost" aliases only, so the file
# holds a neutral name instead of the build host's.
echo sandbox >"$dir/etc/hostname"

# The host is Debian bookworm too, so its gcc builds against the same glibc as the template.
mkdir -p "$dir/usr/local/lib/space"
gcc -shared -fPIC -O2 -Wall -Werror -o "$dir/usr/local/lib/space/statx_shim.so" "$shim"
echo /usr/local/lib/space/statx_shim.so >"$dir/etc/ld.so.preload"

# Package lists and downloaded .debs are large and stale by the time a sandbox runs.
chroot "$dir" apt-get clean
rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin
# debootstrap copied this host's resolver configuration; a sandbox has its own: the worker
# writes "nameserver <gateway>" into each sandbox's rootfs at create (worker_resolv.c).
rm -f "$dir/etc/resolv.conf"
echo "base.sh: done"
