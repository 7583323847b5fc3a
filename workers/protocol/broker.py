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
"""

from __future__ import annotations

import logging

from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)

_original_restore_unacked = kombu_redis.QoS.restore_unacked


def _restore_unacked(self, client=None):
    if client is None and getattr(self.channel.connection, "client", None) is None:
        log.warning(
            "broker connection already released: %d unacknowledged message(s) stay in Redis "
            "for the visibility timeout to restore",
            len(self._delivered),
        )
        return []
    return _original_restore_unacked(self, client)


def survive_broker_loss_with_tasks_in_flight() -> None:
    """Install the guard above (idempotent); call it before a Celery worker starts."""
    kombu_redis.QoS.restore_unacked = _restore_unacked
