"""What the Celery processes on both sides (the control worker, node agents) need of their
Redis broker beyond Celery's settings: to outlive a Redis restart with a task in flight.

kombu restores a channel's delivered-but-unacknowledged messages when it closes the channel.
When Redis dies while a task runs, Celery's consumer can close the connection after kombu's
transport has already let go of its client; the restore then fails with `AttributeError:
'NoneType' object has no attribute 'hostname'`, which Celery treats as unrecoverable, and the
worker exits instead of reconnecting (seen once in tests/integration/test_faults.py: the
control worker stayed down after a Redis restart; cf. celery/kombu#970, #582).

Skipping that one restore loses nothing: the messages are still in the broker's unacked hash,
and kombu's visibility timeout puts them back on their queue (a Redis that restarted empty has
none to put back).

The task that was running then finishes on a channel already closed, and its acknowledgement
(`task_acks_late`) fails the same way (`'NoneType' object has no attribute 'client'`), again
unrecoverable: the control worker exited after a Redis restart (test_faults.py, once in a run of
the suite on two workers). That acknowledgement is dropped too: the message, if Redis still has
it, comes back after the visibility timeout and runs again, which the control tasks allow (a
replica event or node report older than one applied is ignored).
"""

from __future__ import annotations

import logging

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

log = logging.getLogger(__name__)

_original_restore_unacked = kombu_redis.QoS.restore_unacked
_original_ack = kombu_redis.QoS.ack
_original_reject = kombu_redis.QoS.reject


def _released(qos) -> bool:
    """The channel's connection is gone (closed) or has let go of its client."""
    return getattr(qos.channel.connection, "client", None) is None


def _restore_unacked(self, client=None):
    if client is None and _released(self):
        log.warning(
            "broker connection already released: %d unacknowledged message(s) stay in Redis "
            "for the visibility timeout to restore",
            len(self._delivered),
        )
        return []
    return _original_restore_unacked(self, client)


def _settled_here_only(qos, delivery_tag) -> bool:
    """On a released channel: forget the message in this channel's own books and leave it in
    Redis for the visibility timeout (True); otherwise False, for kombu to settle it."""
    if not _released(qos):
        return False
    log.warning(
        "broker connection already released: message %s stays in Redis for the visibility timeout to restore",
        delivery_tag,
    )
    virtual.QoS.ack(qos, delivery_tag)
    return True


def _ack(self, delivery_tag):
    if not _settled_here_only(self, delivery_tag):
        _original_ack(self, delivery_tag)


def _reject(self, delivery_tag, requeue=False):
    if not _settled_here_only(self, delivery_tag):
        _original_reject(self, delivery_tag, requeue)


def survive_broker_loss_with_tasks_in_flight() -> None:
    """Install the guards above (idempotent); call it before a Celery worker starts."""
    kombu_redis.QoS.restore_unacked = _restore_unacked
    kombu_redis.QoS.ack = _ack
    kombu_redis.QoS.reject = _reject
