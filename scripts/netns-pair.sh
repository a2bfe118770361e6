# Two "hosts" on one machine: network namespaces joined by a veth pair. Sourced by
# the multi-host tests and benchmarks (bash).
#   netns_pair_up TAG   creates them; sets NS0 NS1 (namespaces), V0 V1 (devices),
#                       A0 A1 (addresses); returns non-zero with NETNS_ERROR set
#                       when this machine cannot (not root, no ip, no veth)
#   netns_pair_down     removes them (safe to call twice)
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
