#!/bin/busybox sh
# /init of the vm-test guest (busybox, in the initramfs): the mounts the agent uses, the
# kernel's modules that the agent needs, the test (/test.sh), its exit code on a marker line,
# and power off. Whatever happens, the host's timeout ends the guest.
/bin/busybox --install -s /bin
export PATH=/usr/local/bin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
# No tmpfs over /tmp: the initramfs's root is already writable, and a checkout under /tmp
# (CI clones there) puts the root suites' helpers at /tmp/.../target/debug, which a mount
# would hide.
mkdir -p /tmp
mount -t tmpfs tmpfs /run
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
hostname lifeline-vm
for m in $(cat /etc/modules); do
    insmod "/lib/modules/$m" || echo "insmod $m failed"
done
echo "LIFELINE-VM-KERNEL $(uname -r)"
echo "LIFELINE-VM-BEGIN"
sh /test.sh
echo "LIFELINE-VM-EXIT $?"
poweroff -f
