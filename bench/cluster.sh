#!/bin/sh
# An emulated cluster on this one Linux machine, for the benchmarks that need
# a network between nodes (docs/design.md §8): one mpirun over NODES nodes of
# RANKS ranks each, every node a network namespace whose ranks talk over
# shared memory, the nodes joined by veth links shaped with tc; torn down when
# the program ends, fails or is interrupted.
#
#   usage: bench/cluster.sh [options] [--] [MPIRUN-OPTIONS] PROGRAM [ARGS...]
#          bench/cluster.sh [options] --check     set it up and down, run nothing
#          bench/cluster.sh [-p PREFIX] --down    remove what a killed run left
#
#   -n NODES     nodes (2)
#   -m RANKS     MPI ranks per node (2)
#   -r RATE      each node's link, each way, in tc's syntax (1gbit; 0: unshaped)
#   -d DELAY     one-way delay between two nodes, microseconds (0)
#   -b BURST     the tbf burst, tc's syntax (the larger of 32 KiB and 200 us
#                at RATE)
#   -p PREFIX    namespace names PREFIX-sw, PREFIX-n0, ... (ffc): clusters of
#                different prefixes can run side by side
#   -s A.B.C     the nodes' addresses A.B.C.1, A.B.C.2, ... (10.77.0)
#
# Node i is namespace PREFIX-ni, host name PREFIX-ni, address A.B.C.(i+1) on
# its interface net0, a veth whose other end is port nodei of the bridge br0
# in namespace PREFIX-sw (the switch, A.B.C.254). Each link is shaped with
# tbf at RATE on both ends (node egress, switch port egress: a full-duplex
# NIC into a non-blocking switch); the delay is added once per direction on
# the switch port towards the receiving node, by netem, or where the kernel
# has no netem by bench/delayline.c (compiled here with cc, run in the
# switch on iptables' NFQUEUE). Nothing is made in this machine's own
# namespace, and only these addresses are used.
#
# mpirun runs in the switch and starts each node's Open MPI daemon through
# this script as its rsh agent (ip netns exec, in a UTS namespace of the
# node's host name, so that each node has its own shared-memory files):
# hosts are the nodes' addresses, slots RANKS each, so ranks 0..RANKS-1 are
# on node 0; TCP between nodes (btl_tcp_if_include and oob_tcp_if_include
# A.B.C.0/24), shared memory within one; --bind-to none, and
# mpi_yield_when_idle when there are more ranks than cores. Words after the
# options go to mpirun: its own options, then the program. The ranks are
# this machine's processes, so they see this script's environment (no -x
# needed) and files. Prints the cluster's shape on stderr before it runs;
# the exit status is mpirun's.
#
# Needs root and ip, tc, unshare and mpirun; a delay without netem also needs
# iptables and cc. Where something is missing, or a step of the set-up
# fails, it says so in one line and exits with status 2.
#   e.g. bench/cluster.sh -n 2 -m 2 -r 1gbit -d 100 build/fourfold selftest --grid 2x1x1x2
#        bench/cluster.sh -n 2 -m 1 -r 1gbit -d 100 python3 bench/cluster_probe.py
#          (the links as TCP sees them: round trip and one-way rate)
set -eu

if [ "${1:-}" = --agent ]; then
    # Open MPI's rsh agent: --agent PREFIX ADDRESS COMMAND...: COMMAND (one
    # shell command line, possibly in several words) on the node at ADDRESS
    prefix=$2 address=$3
    shift 3
    node=$prefix-n$((${address##*.} - 1))
    exec ip netns exec "$node" unshare --uts \
        sh -c 'hostname "$1" && exec sh -c "$2"' agent "$node" "$*"
fi

say() { echo "cluster: $*" >&2; }
die() {
    say "$*"
    exit 2
}
usage() { sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

NODES=2 RANKS=2 RATE=1gbit DELAY=0 BURST='' PREFIX=ffc SUBNET=10.77.0 DOWN=0 CHECK=0
while [ $# -gt 0 ]; do
    case $1 in
    -n | -m | -r | -d | -b | -p | -s)
        [ $# -ge 2 ] || die "$1 needs a value (bench/cluster.sh --help)"
        case $1 in
        -n) NODES=$2 ;; -m) RANKS=$2 ;; -r) RATE=$2 ;; -d) DELAY=$2 ;;
        -b) BURST=$2 ;; -p) PREFIX=$2 ;; -s) SUBNET=$2 ;;
        esac
        shift 2
        ;;
    --down) DOWN=1 && shift ;;
    --check) CHECK=1 && shift ;;
    -h | --help) usage && exit 0 ;;
    --) shift && break ;;
    -*) die "unknown option $1 (mpirun's options go after --; bench/cluster.sh --help)" ;;
    *) break ;;
    esac
done

is_count() { case $1 in '' | *[!0-9]*) return 1 ;; esac }
is_count "$NODES" && [ "$NODES" -ge 1 ] && [ "$NODES" -le 253 ] || die "-n wants 1 to 253 nodes"
is_count "$RANKS" && [ "$RANKS" -ge 1 ] || die "-m wants a number of ranks per node"
is_count "$DELAY" || die "-d wants the delay in whole microseconds"
case $PREFIX in '' | *[!A-Za-z0-9_]*) die "-p wants letters, digits and _" ;; esac
echo "$SUBNET" | grep -Eq '^[0-9]{1,3}[.][0-9]{1,3}[.][0-9]{1,3}$' || die "-s wants A.B.C (a /24)"
[ "$DOWN" = 1 ] || [ "$CHECK" = 1 ] || [ $# -gt 0 ] || die "no program to run (bench/cluster.sh --help)"

[ "$(id -u)" = 0 ] || die "needs root (network namespaces and tc); run it as root"
for c in ip:iproute2 tc:iproute2 unshare:util-linux mpirun:openmpi-bin; do
    command -v "${c%:*}" > /dev/null 2>&1 ||
        die "needs ${c%:*}, which is not installed (Debian package ${c#*:})"
done

SW=$PREFIX-sw
ours() { # the namespaces of this prefix that exist
    ip netns list 2> /dev/null | while read -r ns _; do
        case $ns in "$SW" | "$PREFIX"-n*) echo "$ns" ;; esac
    done
}

CREATED='' MPIRUN='' WORK=''
remove() { # kills what runs in namespaces $CREATED, then deletes them
    for try in 1 2 3 4 5 6 7 8 9 10 11; do
        pids=$(for ns in $CREATED; do ip netns pids "$ns" 2> /dev/null || :; done)
        [ -n "$pids" ] || break
        # shellcheck disable=SC2086
        case $try in
        1) kill -TERM $pids 2> /dev/null || : ;;
        11) kill -KILL $pids 2> /dev/null || : ;;
        esac
        sleep 0.2
    done
    for ns in $CREATED; do
        ip netns del "$ns" 2> /dev/null || say "could not delete namespace $ns"
    done
    CREATED=''
}
teardown() {
    trap '' PIPE # a reader of our output may be gone (Ctrl-C on a pipeline)
    if [ -n "$MPIRUN" ]; then
        kill -TERM "$MPIRUN" 2> /dev/null || :
        MPIRUN=
    fi
    remove
    [ -z "$WORK" ] || rm -rf "$WORK"
}

if [ "$DOWN" = 1 ]; then
    CREATED=$(ours)
    remove
    for d in /tmp/ff-cluster.*; do
        [ "$(cat "$d/prefix" 2> /dev/null)" != "$PREFIX" ] || rm -rf "$d"
    done
    say "removed the namespaces of prefix $PREFIX"
    exit 0
fi
[ -z "$(ours)" ] || die "namespaces of prefix $PREFIX exist (another run, or one that was killed): pick another -p, or remove them with bench/cluster.sh -p $PREFIX --down"

# tc's rate syntax -> bytes per second, for the default burst
rate_bytes() {
    num=${1%%[!0-9]*}
    unit=$(echo "${1#"$num"}" | tr '[:upper:]' '[:lower:]')
    [ -n "$num" ] || return 1
    case $unit in
    bit | '') echo $((num / 8)) ;;
    kbit) echo $((num * 125)) ;;
    mbit) echo $((num * 125000)) ;;
    gbit) echo $((num * 125000000)) ;;
    tbit) echo $((num * 125000000000)) ;;
    bps) echo "$num" ;;
    kbps) echo $((num * 1000)) ;;
    mbps) echo $((num * 1000000)) ;;
    gbps) echo $((num * 1000000000)) ;;
    *) return 1 ;;
    esac
}
TBF=''
if [ "$RATE" != 0 ]; then
    bps=$(rate_bytes "$RATE") || die "cannot read the rate $RATE (e.g. 1gbit, 100mbit, 10gbit)"
    if [ -z "$BURST" ]; then
        BURST=$((bps / 5000)) # 200 us at RATE
        [ "$BURST" -ge 32768 ] || BURST=32768
        BURST=${BURST}b
    fi
    TBF="tbf rate $RATE burst $BURST latency 20ms"
fi

trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
trap 'exit 141' PIPE # the reader of our output is gone (e.g. | head)
WORK=$(mktemp -d /tmp/ff-cluster.XXXXXX)
echo "$PREFIX" > "$WORK/prefix" # for --down, after a kill -9
# the agent's copy of this script: plm_rsh_agent is split at spaces
cp "$0" "$WORK/cluster.sh"

in_ns() { # NAMESPACE COMMAND...: COMMAND there, or one line saying why not and exit 2
    ns=$1
    shift
    ip netns exec "$ns" "$@" 2> "$WORK/err" || die "in $ns, $*: $(cat "$WORK/err")"
}
netns_add() {
    ip netns add "$1" 2> "$WORK/err" ||
        die "cannot make network namespace $1 here: $(cat "$WORK/err")"
    CREATED="$CREATED $1"
    ip netns exec "$1" sh -c 'for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 \
        /proc/sys/net/ipv6/conf/default/disable_ipv6; do echo 1 > "$f"; done' 2> /dev/null || :
    in_ns "$1" ip link set lo up
}

# the switch: a bridge, and the address mpirun's daemons call back to
netns_add "$SW"
in_ns "$SW" ip link add br0 type bridge
in_ns "$SW" ip link set br0 up
in_ns "$SW" ip addr add "$SUBNET.254/24" dev br0

DELAY_BY=''
if [ "$DELAY" != 0 ]; then
    DELAY_BY=netem
    in_ns "$SW" ip link add probe0 type veth peer name probe1
    ip netns exec "$SW" tc qdisc add dev probe0 root netem delay 1us 2> /dev/null || DELAY_BY=delayline
    in_ns "$SW" ip link del probe0
fi
if [ "$DELAY_BY" = delayline ]; then
    command -v cc > /dev/null 2>&1 ||
        die "this kernel has no netem, and the delay line that replaces it needs cc, which is not installed"
    command -v iptables > /dev/null 2>&1 ||
        die "this kernel has no netem, and the delay line that replaces it needs iptables, which is not installed"
    cc -O2 -o "$WORK/delayline" "$(dirname "$0")/delayline.c" 2> "$WORK/err" ||
        die "cannot compile bench/delayline.c: $(cat "$WORK/err")"
fi

for i in $(seq 0 $((NODES - 1))); do
    node=$PREFIX-n$i
    netns_add "$node"
    in_ns "$SW" ip link add "node$i" type veth peer name net0 netns "$node"
    in_ns "$SW" ip link set "node$i" master br0 up
    in_ns "$node" ip link set net0 up
    in_ns "$node" ip addr add "$SUBNET.$((i + 1))/24" dev net0
    # shellcheck disable=SC2086
    [ -z "$TBF" ] || in_ns "$node" tc qdisc add dev net0 root $TBF
    if [ "$DELAY_BY" = netem ]; then
        in_ns "$SW" tc qdisc add dev "node$i" root handle 1: netem delay "${DELAY}us" limit 100000
        # shellcheck disable=SC2086
        [ -z "$TBF" ] || in_ns "$SW" tc qdisc add dev "node$i" parent 1:1 handle 10: $TBF
    elif [ -n "$TBF" ]; then
        # shellcheck disable=SC2086
        in_ns "$SW" tc qdisc add dev "node$i" root $TBF
    fi
    echo "$SUBNET.$((i + 1)) slots=$RANKS" >> "$WORK/hostfile"
done

if [ "$DELAY_BY" = delayline ]; then
    ip netns exec "$SW" "$WORK/delayline" 0 "$DELAY" 2> "$WORK/delayline.log" &
    for _ in $(seq 50); do
        grep -q ready "$WORK/delayline.log" && break
        sleep 0.1
    done
    grep -q ready "$WORK/delayline.log" || die "the delay line did not start: $(cat "$WORK/delayline.log")"
    # bridged IPv4 goes through iptables (br_netfilter), there to the line
    ip netns exec "$SW" sh -c 'echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables' 2> /dev/null || :
    in_ns "$SW" iptables -A FORWARD -j NFQUEUE --queue-num 0
fi

np=$((NODES * RANKS))
yield=
[ "$np" -le "$(nproc)" ] || yield="--mca mpi_yield_when_idle 1"
link="unshaped"
[ -z "$TBF" ] || link="$RATE each way (tbf, burst $BURST)"
case $DELAY_BY in
netem) link="$link, $DELAY us one-way delay (netem)" ;;
delayline) link="$link, $DELAY us one-way delay (bench/delayline.c: no netem in this kernel)" ;;
esac
say "$NODES nodes x $RANKS ranks ($PREFIX-n0..$PREFIX-n$((NODES - 1)) at $SUBNET.1-$SUBNET.$NODES, mpirun in $SW); links: $link"
if [ "$CHECK" = 1 ]; then
    say "--check: set up without an error, so this machine can run it; taking it down"
    exit 0
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec 3<&0 # mpirun runs in the background, so that a signal reaches the traps at once
# shellcheck disable=SC2086
ip netns exec "$SW" mpirun --hostfile "$WORK/hostfile" -np "$np" \
    --mca plm_rsh_agent "$WORK/cluster.sh --agent $PREFIX" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl self,vader,tcp --mca btl_tcp_if_include "$SUBNET.0/24" \
    --mca oob_tcp_if_include "$SUBNET.0/24" --bind-to none $yield "$@" <&3 3<&- &
MPIRUN=$!
rc=0
wait "$MPIRUN" || rc=$?
MPIRUN=
exit "$rc"
