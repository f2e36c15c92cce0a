#!/bin/sh
# Run dist/nomad-device-lingjun on an older glibc than the build machine's: a chroot of Debian 11
# (bullseye, glibc 2.31: older than Alibaba Cloud Linux 3's 2.32), made by debootstrap from
# Debian's archive, with no Python in it. It runs the hidden self-check (ssl, ctypes, NVML bindings,
# zlib), `check-job`, and the Go conformance host (a static binary) against the file: Nomad's three
# launches, fingerprint, stats, shutdown. Needs root (debootstrap, chroot, mounting /proc).
# Older releases (buster's 2.28, stretch's 2.24) are no longer in Debian's archive; the 2.17 floor
# itself is shown by tests/operator/test_dist.py, which reads every bundled ELF file's needs.
#
#   make dist && python3 tests/conformance/build.py && sh tools/check_old_glibc.sh [ROOT]
set -eu
cd "$(dirname "$0")/.."
root=${1:-build/bullseye-root}
if [ ! -x "$root/bin/sh" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
  debootstrap --variant=minbase bullseye "$root" >/dev/null  # debootstrap's default mirror
fi
mkdir -p "$root/opt/lj"
cp dist/nomad-device-lingjun plugin.hcl tests/conformance/bin/conformance-host \
  examples/jobs/raw-exec-env.nomad.hcl "$root/opt/lj/"
mountpoint -q "$root/proc" || { mount -t proc proc "$root/proc"; trap 'umount "$root/proc"' EXIT; }
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
echo "== $(in_root getconf GNU_LIBC_VERSION) in $root ($(in_root sh -c '. /etc/os-release; echo $PRETTY_NAME'));" \
  "python3 there: $(in_root sh -c 'command -v python3 || echo none')"
rm -rf "$root/root/.cache/nomad-device-lingjun"
echo "== --self-check"
in_root /opt/lj/nomad-device-lingjun --self-check
echo "== check-job"
in_root /opt/lj/nomad-device-lingjun check-job /opt/lj/raw-exec-env.nomad.hcl --profile h800-8 | tail -n 3
echo "== conformance host"
in_root sh -c 'cd /tmp && /opt/lj/conformance-host --plugin /opt/lj/nomad-device-lingjun --config /opt/lj/plugin.hcl \
  --phase all --duration 1.6 --stats-interval 0.5 2>/dev/null' | tail -n 1
echo "== ok: the dist file ran on $(in_root getconf GNU_LIBC_VERSION)"
