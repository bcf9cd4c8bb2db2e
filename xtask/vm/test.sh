# The vm-test guest's test (busybox sh, as root): `lifeline check`, then the agent detecting
# clients on loopback and in a network namespace of their own (a pod's), their traffic and
# their loss. Stops at the first failure, exit 1.
PORT=16443
SERVER=127.0.0.1:$PORT
# The server as a pod reaches it: the host end of a veth pair.
POD_SERVER=10.99.0.1:$PORT

fail() {
    echo "FAIL: $*"
    echo "--- lifeline status"
    lifeline status 2>&1
    echo "--- agent log (last 40 lines)"
    tail -n 40 /tmp/agent.log 2>/dev/null
    exit 1
}

now() { cut -d' ' -f1 /proc/uptime; }

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every 0.2 s until it succeeds.
wait_for() {
    limit=$1 what=$2
    shift 2
    t0=$(now)
    while ! "$@" >/dev/null 2>&1; do
        if awk -v a="$t0" -v b="$(now)" -v l="$limit" 'BEGIN { exit !(b - a > l) }'; then
            fail "$what: not within ${limit}s"
        fi
        usleep 200000
    done
    echo "ok: $what ($(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s)"
}

# client_is PID STATE [TCP]: `lifeline status` lists PID in STATE (with a connection to the
# server's port in TCP state). Columns: PID COMM STATE SINCE POD LOCAL REMOTE ENDPOINT TCP
# RX_BYTES RX_AGE RETRANS REASON.
client_is() {
    lifeline status | awk -v p="$1" -v s="$2" -v t="${3:-}" -v r=":$PORT" '
        $1 == p && $3 == s && (t == "" || (substr($7, length($7) - length(r) + 1) == r && $9 == t)) { found = 1 }
        END { exit !found }'
}

# received PID: its connection shows bytes received and when the last payload came.
received() {
    lifeline status | awk -v p="$1" '$1 == p && $10 > 0 && $11 != "-" { found = 1 } END { exit !found }'
}

all() { "$1" "$early" $2 $3 && "$1" "$late" $2 $3 && "$1" "$pod" $2 $3; }

# A network namespace of its own, as a pod has, joined to this one by a veth pair (busybox
# names the peer veth0); made before `lifeline check`, so that check enters it too.
unshare -n sleep 100000 &
podns=$!
usleep 200000
ip link add v0 type veth || fail "cannot create a veth pair"
ip link set veth0 netns $podns || fail "cannot move veth0 into the pod's namespace"
ip addr add 10.99.0.1/24 dev v0
ip link set v0 up
nsenter -t $podns -n sh -c 'ip link set lo up; ip addr add 10.99.0.2/24 dev veth0; ip link set veth0 up' ||
    fail "cannot set up the pod's namespace"

echo "== lifeline check"
lifeline check >/tmp/check.out 2>&1
rc=$?
cat /tmp/check.out
[ "$rc" = 0 ] || fail "lifeline check exited $rc"
# As root with every mount in place, nothing may leave the agent blind either.
! grep -q '\[WARN\]' /tmp/check.out || fail "lifeline check warns: $(grep '\[WARN\]' /tmp/check.out)"

echo "== detection: lifeline run, ll-server, two ll-clients on loopback and one in the pod's namespace"
mkfifo /tmp/server.in /tmp/early.in /tmp/late.in /tmp/pod.in
ll-server --listen 0.0.0.0:$PORT </tmp/server.in >/tmp/server.out 2>&1 &
server=$!
exec 3>/tmp/server.in
wait_for 10 "ll-server listening" grep -q listening /tmp/server.out

# One client connects before the agent starts (found by its start-up scan: sock_diag) ...
ll-client --connect $SERVER </tmp/early.in >/tmp/early.out 2>&1 &
early=$!
exec 4>/tmp/early.in
wait_for 10 "early ll-client connected" grep -q '^connected' /tmp/early.out
# ... and so does the pod's (found by the scan of its namespace, entered with setns).
nsenter -t $podns -n ll-client --connect $POD_SERVER </tmp/pod.in >/tmp/pod.out 2>&1 &
pod=$!
exec 6>/tmp/pod.in
wait_for 10 "pod's ll-client connected" grep -q '^connected' /tmp/pod.out

lifeline run --endpoint $SERVER --endpoint $POD_SERVER --listen 127.0.0.1:9477 \
    --disconnect-grace 3s --min-client-age 1s --stale-after 4s --blackhole-after 3s >/tmp/agent.log 2>&1 &
agent=$!
wait_for 60 "agent ready (/readyz)" wget -q -O /dev/null http://127.0.0.1:9477/readyz

# ... and one after (seen connecting: sock/inet_sock_set_state).
ll-client --connect $SERVER </tmp/late.in >/tmp/late.out 2>&1 &
late=$!
exec 5>/tmp/late.in
wait_for 10 "late ll-client connected" grep -q '^connected' /tmp/late.out
wait_for 20 "the three clients listed healthy, ESTABLISHED to the server" all client_is healthy ESTABLISHED
lifeline status

# The server answers: payload on every connection (tcp/tcp_probe; bytes from sock_diag's tcp_info).
echo "send 1000" >&3
wait_for 10 "payload received on the three connections" all received

# The late client sends a request that gets no answer: stale after --stale-after (the ordered
# evidence of tcp/tcp_probe: the server's ACK arrives after the request, no payload follows).
late_port=$(awk '/^connected/ { n = split($2, a, ":"); print a[n]; exit }' /tmp/late.out)
echo "send $late_port 500" >&5
wait_for 20 "late client stale (request unanswered for 4s)" client_is "$late" stale ESTABLISHED
client_is "$early" healthy ESTABLISHED || fail "early client not healthy while the late one is stale"
client_is "$pod" healthy ESTABLISHED || fail "pod's client not healthy while the late one is stale"
lifeline status

# The pod's path breaks (the host end of its veth down): its request is retransmitted and
# never acknowledged, so it is blackholed after --blackhole-after (tcp/tcp_retransmit_skb).
pod_port=$(awk '/^connected/ { n = split($2, a, ":"); print a[n]; exit }' /tmp/pod.out)
ip link set v0 down
echo "send $pod_port 500" >&6
wait_for 20 "pod's client blackholed (retransmits, no ACK for 3s)" client_is "$pod" blackholed ESTABLISHED
lifeline status
# The path is back and the server answers: healthy again.
ip link set v0 up
ip addr add 10.99.0.1/24 dev v0 2>/dev/null
wait_for 30 "pod's request acknowledged once its path is back" sh -c 'lifeline status | awk -v p='"$pod"' "\$1 == p && \$3 != \"blackholed\" { f = 1 } END { exit !f }"'
echo "send 100" >&3
wait_for 20 "pod's client healthy again" client_is "$pod" healthy ESTABLISHED

# The server dies: all lose it (FIN → CLOSE_WAIT) and are disconnected after the 3 s grace.
kill -9 $server
wait_for 20 "the three clients disconnected after the server died" all client_is disconnected
lifeline status

kill $agent
wait $agent
rc=$?
[ "$rc" = 0 ] || fail "agent exited $rc on SIGTERM"
echo "ok: agent exited 0 on SIGTERM"
# The client uprobes (Go and OpenSSL streams) passed this kernel's verifier: the agent says
# otherwise. REFUSED (set by xtask for a kernel known to refuse a set, `grep -E` words of its
# log line) must then be refused, and nothing else.
refusals=$(grep -E "streams are not followed|requests are not followed" /tmp/agent.log)
if [ -n "$REFUSED" ]; then
    echo "$refusals" | grep -qE "$REFUSED" || fail "this kernel was expected to refuse what the log would say as '$REFUSED'; it did not"
    echo "ok: as expected on this kernel: $(echo "$refusals" | grep -E "$REFUSED" | sed 's/.*WARN [^ ]* //' | cut -c1-160)"
    refusals=$(echo "$refusals" | grep -vE "$REFUSED")
fi
[ -z "$refusals" ] || fail "the client uprobes did not load: $(echo "$refusals" | cut -c1-300)"
echo "ok: the Go and OpenSSL client uprobes loaded, but for what this kernel refuses (${REFUSED:-nothing})"

# A kernel without what the agent needs (its BTF hidden here, as on a kernel built without
# CONFIG_DEBUG_INFO_BTF): `check` names it in one line, and `run` stays up, not ready, saying
# why once, rather than exiting (a DaemonSet would crash-loop).
echo "== a kernel without BTF (an empty file over /sys/kernel/btf/vmlinux)"
: >/tmp/no-btf
mount --bind /tmp/no-btf /sys/kernel/btf/vmlinux || fail "cannot hide the kernel's BTF"
lifeline check >/tmp/check.out 2>&1
rc=$?
tail -n 1 /tmp/check.out
[ "$rc" = 1 ] || fail "lifeline check exited $rc without BTF, not 1"
tail -n 1 /tmp/check.out | grep -q '^the agent cannot run here: missing tracepoints + offsets (kernel BTF' ||
    fail "lifeline check's verdict does not name the missing BTF"
lifeline run --endpoint $SERVER --listen 127.0.0.1:9478 >/tmp/agent.log 2>&1 &
agent=$!
readyz() { printf 'GET /readyz HTTP/1.0\r\n\r\n' | nc 127.0.0.1 9478 >/tmp/readyz.out 2>&1; }
unready() { readyz; grep -q '503 Service Unavailable' /tmp/readyz.out && grep -q 'not ready: this kernel cannot run the agent: .*BTF' /tmp/readyz.out; }
wait_for 30 "/readyz answers 503 with the reason" unready
tail -n 1 /tmp/readyz.out
sleep 3
kill -0 $agent 2>/dev/null || fail "the agent exited without BTF"
wget -q -O /dev/null http://127.0.0.1:9478/healthz || fail "/healthz fails without BTF"
n=$(grep -c 'this kernel cannot run the agent' /tmp/agent.log)
[ "$n" = 1 ] || fail "the agent's log says why $n times, not once"
echo "ok: the agent stays up, alive and not ready, and says why once"
kill $agent
wait $agent
rc=$?
[ "$rc" = 0 ] || fail "agent without BTF exited $rc on SIGTERM"
umount /sys/kernel/btf/vmlinux
echo "PASS"
