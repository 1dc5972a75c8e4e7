#!/usr/bin/env bash
# Namespace lab: two network namespaces joined by a veth pair, so the real tc path and real
# sockets can be exercised on one machine. Root only.
#
#   pp-edge   (veth pp-edge0, 10.213.0.1/24)  <---->  pp-server (veth pp-server0, 10.213.0.2/24)
#
# Usage: sudo netem/lab.sh up | down | status
# Run a stage inside:  sudo ip netns exec pp-server python partition1.py --host 10.213.0.2 ...
#                      sudo ip netns exec pp-edge   python partition2.py --host 10.213.0.2 ...
# Shape the edge's uplink: sudo python network_delay.py apply --netns pp-edge --dev pp-edge0 --profile lte
set -euo pipefail

EDGE_NS=${PP_LAB_EDGE_NS:-pp-edge}
SERVER_NS=${PP_LAB_SERVER_NS:-pp-server}
EDGE_IF=${PP_LAB_EDGE_IF:-pp-edge0}
SERVER_IF=${PP_LAB_SERVER_IF:-pp-server0}
EDGE_IP=${PP_LAB_EDGE_IP:-10.213.0.1}
SERVER_IP=${PP_LAB_SERVER_IP:-10.213.0.2}

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "error: the lab needs root (network namespaces); run with sudo" >&2
    exit 1
  fi
}

down() {
  ip netns del "$EDGE_NS" 2>/dev/null || true
  ip netns del "$SERVER_NS" 2>/dev/null || true
}

up() {
  down
  ip netns add "$EDGE_NS"
  ip netns add "$SERVER_NS"
  ip link add "$EDGE_IF" type veth peer name "$SERVER_IF"
  ip link set "$EDGE_IF" netns "$EDGE_NS"
  ip link set "$SERVER_IF" netns "$SERVER_NS"
  ip -n "$EDGE_NS" addr add "$EDGE_IP/24" dev "$EDGE_IF"
  ip -n "$SERVER_NS" addr add "$SERVER_IP/24" dev "$SERVER_IF"
  for ns in "$EDGE_NS" "$SERVER_NS"; do ip -n "$ns" link set lo up; done
  ip -n "$EDGE_NS" link set "$EDGE_IF" up
  ip -n "$SERVER_NS" link set "$SERVER_IF" up
  echo "lab up: $EDGE_NS/$EDGE_IF $EDGE_IP <-> $SERVER_NS/$SERVER_IF $SERVER_IP"
}

case "${1:-}" in
  up) need_root; up ;;
  down) need_root; down; echo "lab down" ;;
  status) ip netns list | grep -E "^($EDGE_NS|$SERVER_NS)( |$)" || echo "lab is down" ;;
  -h|--help|help) usage ;;
  *) usage; exit 2 ;;
esac
