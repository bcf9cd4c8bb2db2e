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
# The tracepoints the agent attaches stay switched on for the guest's life, their events
# going nowhere (tracing off, a small buffer): each agent a test starts and stops would
# otherwise switch their static keys on and off, and under TCG a vCPU can run the patched
# call site's old breakpoint after the patch is done; the 6.12 guest died so in one CI run
# ("Oops: int3" at inet_sk_state_store+0x15 during a connect, the bytes there already the
# new jump). On hardware the kernel's patching is safe; this is the emulator's.
echo 0 > /sys/kernel/tracing/tracing_on
echo 4 > /sys/kernel/tracing/buffer_size_kb
for e in sock/inet_sock_set_state sock/inet_sk_error_report tcp/tcp_retransmit_skb \
    tcp/tcp_probe sched/sched_process_exec; do
    [ -e "/sys/kernel/tracing/events/$e/enable" ] && echo 1 > "/sys/kernel/tracing/events/$e/enable" &&
        kept="$kept $e"
done
echo "tracepoints kept on:$kept"
for m in $(cat /etc/modules); do
    insmod "/lib/modules/$m" || echo "insmod $m failed"
done
echo "LIFELINE-VM-KERNEL $(uname -r)"
echo "LIFELINE-VM-BEGIN"
sh /test.sh
echo "LIFELINE-VM-EXIT $?"
poweroff -f
