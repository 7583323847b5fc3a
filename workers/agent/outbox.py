"""Messages from a node agent to the control worker, sent in order and never dropped for a
broker outage: a sender thread retries with backoff until the broker takes each one. Node
reports are latest-wins (only the newest waiting one is kept); replica events all go."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from workers.protocol.control import CONTROL_QUEUE, NODE_REPORT, REPLICA_EVENT, NodeReport, ReplicaEvent

log = logging.getLogger(__name__)
MAX_BACKOFF_SECONDS = 5.0


class Outbox:
    def __init__(self, app, report_expires: float):
        self.app = app
        self.report_expires = report_expires
        self._events: deque[ReplicaEvent] = deque()
        self._report: NodeReport | None = None
        self._cond = threading.Condition()
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="agent-outbox", daemon=True)

    def replica_event(self, event: ReplicaEvent) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def node_report(self, report: NodeReport) -> None:
        with self._cond:
            self._report = report
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._events) + (self._report is not None)

    def flush(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until everything queued has been sent."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._events or self._report is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float) -> None:
        """Stop after sending what is queued (at most `timeout` seconds)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.thread.join(timeout)

    def _next(self):
        with self._cond:
            while not (self._events or self._report or self._closed):
                self._cond.wait()
            if self._events:  # events first: a report must not overtake what it summarises
                return self._events[0]
            return self._report

    def _sent(self, item) -> None:
        with self._cond:
            if self._events and self._events[0] is item:
                self._events.popleft()
            elif self._report is item:
                self._report = None
            self._cond.notify_all()  # a flush may be waiting

    def _run(self) -> None:
        backoff = 0.2
        while True:
            item = self._next()
            if item is None:
                return  # closed and nothing left
            try:
                if isinstance(item, ReplicaEvent):
                    self.app.send_task(REPLICA_EVENT, args=[item.to_wire()], queue=CONTROL_QUEUE, retry=False)
                else:
                    self.app.send_task(
                        NODE_REPORT,
                        args=[item.to_wire()],
                        queue=CONTROL_QUEUE,
                        retry=False,
                        expires=self.report_expires,
                    )
            except Exception as exc:  # the broker is away: keep the message, try again
                with self._cond:
                    if self._closed:
                        log.error("dropping %d unsent message(s) at shutdown: %s", len(self._events), exc)
                        return
                log.warning("cannot reach the broker (%s); retrying in %.1fs", exc, backoff)
                with self._cond:
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                continue
            backoff = 0.2
            self._sent(item)
