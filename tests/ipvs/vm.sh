#!/bin/sh
# vm.sh GUEST_SCRIPT [ARGS...]: run GUEST_SCRIPT as root inside a throwaway Debian kernel
# (which has IPVS, ip_set, xt_set; this host's kernel may not) booted under qemu, and exit
# with its status. The guest sees the host's root file system read-only (9p) under a RAM
# overlay, so host binaries, the test binary and files written *before* the boot are all
# visible at their host paths; writes inside vanish. The guest starts in the caller's
# working directory. Its output (stdout + stderr, over the serial console) is ours.
#
# Exit status: the script's; 125 when the guest never reported one (boot failure, timeout:
# qemu is always killed after SVC_IPVS_TIMEOUT seconds); 124 when a tool is missing here.
#
# Environment:
#   SVC_IPVS_CACHE    where the initramfs and the unpacked kernel are kept
#                     (default: $XDG_CACHE_HOME or ~/.cache, /svc-compile-ipvs-vm)
#   SVC_IPVS_SHARE    a host directory shared read-write at the same path (results out)
#   SVC_IPVS_TIMEOUT  seconds before qemu is killed (default 600)
#   SVC_IPVS_MEM      guest MiB (default 768)
#   SVC_IPVS_KVER     kernel version (default: the newest /boot/vmlinuz-*)
#
# Needs: qemu-system-x86 linux-image-amd64 busybox-static cpio kmod xz-utils (and, for
# what the guest runs, ipvsadm ipset iptables iproute2). No root needed to boot.
set -eu
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: $0 GUEST_SCRIPT [ARGS...]" >&2; exit 2; }
for t in qemu-system-x86_64 busybox cpio modprobe xz; do
  command -v "$t" >/dev/null 2>&1 || [ -x "/sbin/$t" ] || [ -x "/bin/$t" ] ||
    { echo "vm.sh: $t is not installed" >&2; exit 124; }
done
KVER=${SVC_IPVS_KVER:-$(ls /boot 2>/dev/null | sed -n 's/^vmlinuz-//p' | sort -V | tail -1)}
[ -n "$KVER" ] && [ -f "/boot/vmlinuz-$KVER" ] && [ -d "/lib/modules/$KVER" ] ||
  { echo "vm.sh: no kernel image in /boot (apt-get install linux-image-amd64)" >&2; exit 124; }
CACHE=${SVC_IPVS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/svc-compile-ipvs-vm}
INITRD=$CACHE/initramfs-$KVER.cpio.gz
VMLINUX=$CACHE/vmlinux-$KVER

# --- once per kernel: the uncompressed kernel and a tiny initramfs ----------------------
# qemu boots the ELF vmlinux directly (PVH entry): no firmware, no decompression; much
# faster under TCG. Debian's vmlinuz is setup code + an xz stream: cut at the xz magic.
if [ ! -s "$VMLINUX" ]; then
  mkdir -p "$CACHE"
  off=$(LC_ALL=C grep -abo "$(printf '\3757zXZ')" "/boot/vmlinuz-$KVER" | head -1 | cut -d: -f1)
  [ -n "$off" ] || { echo "vm.sh: /boot/vmlinuz-$KVER is not xz-compressed" >&2; exit 124; }
  tail -c +$((off + 1)) "/boot/vmlinuz-$KVER" | xz -dc --single-stream > "$VMLINUX.$$"
  mv "$VMLINUX.$$" "$VMLINUX"   # rename: concurrent builders never see half a file
fi
if [ ! -s "$INITRD" ]; then
  mkdir -p "$CACHE"
  T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
  mkdir -p "$T/bin" "$T/mods" "$T/proc" "$T/sys" "$T/dev" "$T/lower" "$T/rw" "$T/host"
  cp "$(command -v busybox)" "$T/bin/busybox"   # busybox-static: no libraries
  ln -s busybox "$T/bin/sh"
  # Only what mounting the host root needs; everything else autoloads from the host's
  # /lib/modules once PID 1 runs chrooted there.
  for m in virtio_pci 9pnet_virtio 9p overlay; do
    modprobe -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    cp "$ko" "$T/mods/"; basename "$ko" >> "$T/mods/order"
  done
  cat > "$T/init" <<'INIT'
#!/bin/sh
# PID 1: the host root (9p tag "host", read-only) under a tmpfs overlay, then chroot into it
# *as PID 1*, so the kernel's module autoload runs the host's /sbin/modprobe.
export PATH=/bin
busybox mount -t proc proc /proc; busybox mount -t sysfs sys /sys; busybox mount -t devtmpfs dev /dev
for ko in $(busybox cat /mods/order); do busybox insmod /mods/$ko; done
busybox mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 host /lower
busybox mount -t tmpfs tmpfs /rw; busybox mkdir /rw/up /rw/work
busybox mount -t overlay -o lowerdir=/lower,upperdir=/rw/up,workdir=/rw/work overlay /host
for d in proc sys dev; do busybox mount --rbind /$d /host/$d; done
busybox mount -t tmpfs -o mode=755 tmpfs /host/run
busybox mkdir -p /host/run/svc-vm /host/run/netns /host/dev/pts /host/dev/shm
busybox mount -t devpts devpts /host/dev/pts; busybox mount -t tmpfs tmpfs /host/dev/shm
busybox mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 xfer /host/run/svc-vm
exec busybox chroot /host /bin/sh /run/svc-vm/stage2
INIT
  chmod +x "$T/init"
  (cd "$T" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.$$"
  mv "$INITRD.$$" "$INITRD"
  rm -rf "$T"; trap - EXIT
fi

# --- one run ------------------------------------------------------------------------------
X=$(mktemp -d)
QPID=
# `timeout` passes our TERM on to qemu; its own deadline sends KILL.
cleanup() { [ -n "$QPID" ] && kill -TERM "$QPID" 2>/dev/null; rm -rf "$X"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
cp "$1" "$X/script"; chmod +x "$X/script"; shift
q() { printf "'%s'" "$(printf %s "$1" | sed "s/'/'\\\\''/g")"; }   # shell-quote
SHARE=${SVC_IPVS_SHARE:+$(cd "$SVC_IPVS_SHARE" && pwd)}
{ # stage2 runs as PID 1 in the chroot: this run's cwd, arguments and share baked in
  echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root'
  [ -n "$SHARE" ] && echo "mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 share $(q "$SHARE")"
  echo "cd $(q "$(pwd)") 2>/dev/null || cd /"
  printf 'set --'; for a in "$@"; do printf ' %s' "$(q "$a")"; done; echo
  echo 'echo "svc-vm: guest script starts at uptime $(cut -d" " -f1 /proc/uptime)s"'
  echo '/run/svc-vm/script "$@" </dev/null 2>&1; echo $? > /run/svc-vm/rc'
  echo 'sync; busybox poweroff -f 2>/dev/null; echo o > /proc/sysrq-trigger'
} > "$X/stage2"
# Fast TCG boot: no mitigations/KASLR/self-tests/PS2 probing, a trusted TSC.
APPEND="console=ttyS0 panic=-1 mitigations=off nokaslr tsc=reliable no_timer_check"
APPEND="$APPEND cryptomgr.notests i8042.noaux i8042.nokbd i8042.nopnp 8250.nr_uarts=1"
APPEND="$APPEND audit=0 apparmor=0 random.trust_cpu=on quiet loglevel=0"
set -- -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$X,mount_tag=xfer,security_model=none"
[ -n "$SHARE" ] && set -- "$@" -virtfs "local,path=$SHARE,mount_tag=share,security_model=none"
# tb-size caps the translation cache (qemu's RSS); 1 vCPU: 2 are slower under TCG on 2 cores.
timeout -s KILL "${SVC_IPVS_TIMEOUT:-600}" qemu-system-x86_64 -accel tcg,tb-size=128 -cpu max -m "${SVC_IPVS_MEM:-768}" -smp 1 \
  -no-reboot -nodefaults -nic none -display none -monitor none -serial stdio "$@" \
  -kernel "$VMLINUX" -initrd "$INITRD" -append "$APPEND" </dev/null > "$X/console" &
QPID=$!
wait "$QPID" 2>/dev/null || true
QPID=
sed 's/\r$//' "$X/console"
[ -s "$X/rc" ] || { echo "vm.sh: guest did not finish (boot failure or timeout)" >&2; exit 125; }
exit "$(cat "$X/rc")"
