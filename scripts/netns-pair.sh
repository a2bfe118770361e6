# Two "hosts" on one machine: network namespaces joined by a veth pair. Sourced by
# the multi-host tests and benchmarks (bash).
#   netns_pair_up TAG   creates them; sets NS0 NS1 (namespaces), V0 V1 (devices),
#                       A0 A1 (addresses); returns non-zero with NETNS_ERROR set
#                       when this machine cannot (not root, no ip, no veth)
#   netns_pair_down     removes them (safe to call twice)
#   netns_bench_up TAG  for a benchmark's part across the two hosts: netns_pair_up
#                       with tc at hand, or it prints "   skipped: REASON", leaves
#                       nothing behind and returns non-zero
#   netns_pair_shape RATE [BURST]
#                       shapes both ends with tc tbf (e.g. 10gbit, burst 4mb)
#   netns_pair_run ERR PORT CMD…
#                       runs CMD on both hosts as the two nodes of one job
#                       (--nnodes 2 --node-rank N --rdzv A0:PORT appended; "{node}"
#                       in an argument becomes N), each node's stderr in ERR0/ERR1,
#                       TESSERA_TCP_DELAY_US=$NETNS_DELAY_US (0 if unset); waits for
#                       both, returns node 0's status
netns_pair_up() {
  local tag=$1 id=$$
  NS0=${tag}0_$id NS1=${tag}1_$id V0=${tag}v0_$id V1=${tag}v1_$id
  local subnet=10.$((id % 200 + 20)).$((id / 200 % 250)).
  A0=${subnet}1 A1=${subnet}2
  NETNS_ERROR=""
  [ "$(id -u)" = 0 ] || { NETNS_ERROR="needs root to create network namespaces"; return 1; }
  command -v ip > /dev/null || { NETNS_ERROR="iproute2 (ip) is not installed"; return 1; }
  local err
  err=$(ip netns add "$NS0" 2>&1) || { NETNS_ERROR="network namespaces unavailable: $err"; return 1; }
  err=$(ip netns add "$NS1" 2>&1) || { NETNS_ERROR="cannot create a second namespace: $err"; return 1; }
  err=$(ip link add "$V0" type veth peer name "$V1" 2>&1) || { NETNS_ERROR="veth unavailable: $err"; return 1; }
  ip link set "$V0" netns "$NS0" && ip link set "$V1" netns "$NS1" &&
    ip -n "$NS0" addr add "$A0/24" dev "$V0" && ip -n "$NS1" addr add "$A1/24" dev "$V1" &&
    ip -n "$NS0" link set lo up && ip -n "$NS1" link set lo up &&
    ip -n "$NS0" link set "$V0" up && ip -n "$NS1" link set "$V1" up ||
    { NETNS_ERROR="cannot configure the veth pair"; return 1; }
}

netns_pair_down() {
  [ -n "${NS0:-}" ] && ip netns del "$NS0" 2> /dev/null
  [ -n "${NS1:-}" ] && ip netns del "$NS1" 2> /dev/null
  return 0
}

netns_bench_up() {
  if ! command -v tc > /dev/null; then
    echo "   skipped: tc (iproute2) is not installed"
    return 1
  fi
  if ! netns_pair_up "$1"; then
    echo "   skipped: $NETNS_ERROR"
    netns_pair_down
    return 1
  fi
}

netns_pair_shape() {
  local rate=$1 burst=${2:-4mb}
  ip netns exec "$NS0" tc qdisc replace dev "$V0" root tbf rate "$rate" burst "$burst" latency 20ms &&
    ip netns exec "$NS1" tc qdisc replace dev "$V1" root tbf rate "$rate" burst "$burst" latency 20ms
}

netns_pair_run() {
  local err=$1 port=$2 node ns arg
  shift 2
  local pids=()
  for node in 0 1; do
    ns=$NS0
    [ "$node" = 1 ] && ns=$NS1
    local args=()
    for arg in "$@"; do args+=("${arg//\{node\}/$node}"); done
    TESSERA_TCP_DELAY_US=${NETNS_DELAY_US:-0} ip netns exec "$ns" "${args[@]}" --nnodes 2 \
      --node-rank "$node" --rdzv "$A0:$port" > /dev/null 2> "$err$node" &
    pids+=($!)
  done
  local rc=0
  wait "${pids[0]}" || rc=$?
  wait "${pids[1]}"
  return $rc
}
