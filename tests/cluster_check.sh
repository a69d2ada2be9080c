#!/bin/sh
# The emulated cluster of bench/cluster.sh (docs/design.md §8), 2 nodes x 2
# ranks on links shaped to 1 Gbit/s with a 100 us one-way delay (netem, or
# bench/delayline.c where the kernel has none; no delay where neither can
# run): fourfold's selftest must pass with ranks 0-1 on host PREFIX-n0 and
# 2-3 on PREFIX-n1, and `bench coll` must see 2 nodes of 2 (MPI's
# shared-memory domains); a program that exits 3 must make the script exit
# 3; and no run may leave a namespace behind. Asserts no timing. Skipped
# where this machine cannot make a network namespace with a shaped veth in
# it (not root, no iproute2, a container without CAP_NET_ADMIN, a kernel
# without tbf).   usage: cluster_check.sh FOURFOLD SOURCE_DIR
set -u
FF=$1 SRC=$2
P=ffct$$
skip() {
    echo "cluster_check: skipped ($*)"
    exit 0
}
[ "$(id -u)" = 0 ] || skip "not root"
for c in ip tc unshare; do command -v "$c" > /dev/null 2>&1 || skip "no $c"; done
ip netns add "$P-probe" 2> /dev/null || skip "cannot make a network namespace here"
shaped=0 netem=0
ip -n "$P-probe" link add v0 type veth peer name v1 2> /dev/null &&
    ip netns exec "$P-probe" tc qdisc add dev v0 root tbf rate 1gbit burst 32kb latency 20ms \
        2> /dev/null && shaped=1
ip netns exec "$P-probe" tc qdisc add dev v1 root netem delay 1us 2> /dev/null && netem=1
ip netns del "$P-probe"
[ "$shaped" = 1 ] || skip "no veth or no tbf in this kernel"
delay=100
[ "$netem" = 1 ] || { command -v cc > /dev/null 2>&1 && command -v iptables > /dev/null 2>&1; } ||
    delay=0
WORK=$(mktemp -d)
trap 'sh "$SRC/bench/cluster.sh" -p "$P" --down > /dev/null 2>&1; rm -rf "$WORK"' EXIT

fail=0
need() { # CONDITION-STATUS WHAT
    if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2" && fail=1; fi
}
left() { # the namespaces of prefix $P that exist
    ip netns list | awk -v p="$P-" 'index($1, p) == 1 { printf " %s", $1 }'
}

sh "$SRC/bench/cluster.sh" -p "$P" -n 2 -m 2 -r 1gbit -d "$delay" "$FF" selftest \
    --grid 2x1x1x2 > "$WORK/selftest" 2>&1
need $? "selftest --grid 2x1x1x2 on 2 nodes x 2 ranks, 1gbit, $delay us: exit status 0"
grep -q '^selftest: all [0-9]* checks passed' "$WORK/selftest"
need $? "selftest: all checks passed"
hosts=$(awk '$1 ~ /^[0-3]$/ && NF == 6 { printf "%s:%s ", $1, $6 }' "$WORK/selftest")
[ "$hosts" = "0:$P-n0 1:$P-n0 2:$P-n1 3:$P-n1 " ]
need $? "ranks on hosts: $hosts"
[ -z "$(left)" ]
need $? "no namespace left after it$(left)"

sh "$SRC/bench/cluster.sh" -p "$P" -n 2 -m 2 -r 0 "$FF" bench coll --colls allreduce \
    --algos ring -b 4K -e 4K -n 1 -w 0 > "$WORK/coll" 2>&1
need $? "bench coll on 2 nodes x 2 ranks, unshaped: exit status 0"
grep -q '4 ranks (2 node(s) x 2)' "$WORK/coll"
need $? "bench coll: $(grep -o '[0-9]* ranks ([0-9]* node(s) x [0-9]*)' "$WORK/coll")"
[ -z "$(left)" ]
need $? "no namespace left after it$(left)"

sh "$SRC/bench/cluster.sh" -p "$P" -n 2 -m 1 sh -c 'exit 3' > "$WORK/fail" 2>&1
rc=$?
[ "$rc" = 3 ]
need $? "a program exiting 3 on 2 nodes: exit status $rc"
[ -z "$(left)" ]
need $? "no namespace left after it$(left)"
[ "$fail" = 0 ] || { cat "$WORK/selftest" "$WORK/coll" "$WORK/fail"; exit 1; }
