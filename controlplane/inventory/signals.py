"""What the inventory tells the apps above it, which it does not import (NetBox's way): they
connect receivers in their AppConfig.ready()."""

from django.dispatch import Signal

# A node's heartbeat went stale and it was just marked offline; sent inside that transaction
# (sender: Node; node: the Node, reason: words for the audit trail). The deployments app stops
# the node's replicas so the reconciler places them elsewhere.
node_went_silent = Signal()
