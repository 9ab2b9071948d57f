#!/bin/sh
# Removes what the worker hosts of a test (tests/harness/host.h) left behind when the test did
# not get to remove them itself (killed at its timeout, crashed): each host's record in
# $SPACE_HOME/run/host-<n>.state names its daemons, namespace, veth, forwarding table and state
# directory. Run by the stack's fixtures before `space down --purge` (tests/CMakeLists.txt).
# Usage: hosts-down.sh   (SPACE_HOME and SPACE_BIN_DIR from the environment)
set -u
for rec in "$SPACE_HOME"/run/host-*.state; do
  [ -f "$rec" ] || continue
  netns='' veth='' dir='' worker_pid='' egressd_pid=''
  # shellcheck source=/dev/null
  . "$rec"
  for pid in $worker_pid $egressd_pid; do
    [ "$pid" -gt 0 ] 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  done
  pkill -KILL -f -- "--root=$dir/runsc( |\$)" 2>/dev/null
  sleep 0.5
  [ -e "/run/netns/$netns" ] || ip netns add "$netns"
  nsenter --net="/run/netns/$netns" "$SPACE_BIN_DIR/space-worker" --teardown \
    --state-dir "$dir" >/dev/null 2>&1 || echo "hosts-down: teardown of $dir failed" >&2
  ip netns del "$netns" 2>/dev/null
  ip link del "$veth" 2>/dev/null
  nft delete table ip "$veth" 2>/dev/null
  rm -f "$rec"
done
exit 0
