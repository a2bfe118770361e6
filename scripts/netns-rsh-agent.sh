#!/usr/bin/env bash
# mpirun's remote-shell agent for network-namespace "hosts" on one machine
# (`mpirun --mca plm_rsh_agent scripts/netns-rsh-agent.sh -H ADDRESS:N …`): called
# as AGENT ADDRESS CMD…, it runs CMD in the namespace that the environment variable
# TESSERA_NETNS_OF_<ADDRESS, dots as underscores> names. Tests only.
host=$1
shift
var="TESSERA_NETNS_OF_${host//./_}"
[ -n "${!var:-}" ] || { echo "netns-rsh-agent: no namespace for $host (set $var)" >&2; exit 1; }
exec ip netns exec "${!var}" /bin/sh -c "$*"
