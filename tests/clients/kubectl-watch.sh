#!/bin/bash
# A kubectl raw-watch re-dial loop. `kubectl get pods -w` (and `get --raw ...?watch=1`) exits 0
# silently when the server ends its watch and never dials again, so this loop does.
#
#   kubectl-watch.sh KUBECONFIG [PATH]
#
# PATH defaults to /api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=true; $KUBECTL
# defaults to Debian's kubectl 1.20 unpacked under /opt/lifeline-kubectl-1.20. kubectl prints
# the watch events (one JSON object a line) on stdout; this script adds `kubectl exited RC` on
# stderr after each run.
set -u
KUBECTL=${KUBECTL:-/opt/lifeline-kubectl-1.20/usr/bin/kubectl}
K=${1:?usage: kubectl-watch.sh KUBECONFIG [PATH]}
P=${2:-'/api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=true'}
while true; do
    "$KUBECTL" --kubeconfig "$K" get --raw "$P"
    echo "kubectl exited $?" >&2
    sleep 1
done
