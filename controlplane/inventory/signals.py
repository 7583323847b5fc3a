"""What the inventory tells the apps above it, which it does not import (NetBox's way): they
connect receivers in their AppConfig.ready()."""

from django.dispatch import Signal

# A node's heartbeat went stale and it was just marked offline; sent inside that transaction
# (sender: Node; node: the Node, reason: words for the audit trail). The deployments app stops
# the node's replicas so the reconciler places them elsewhere.
node_went_silent = Signal()

# A node registered, or came back online, and can take replicas; sent inside that transaction
# (sender: Node; node: the Node). The deployments app reconciles at once rather than at the next
# periodic pass: replicas waiting for a node (`make run` creates the demo deployment before its
# agent is up) start seconds sooner.
node_came_online = Signal()
