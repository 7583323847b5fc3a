"""`python -m workers.agent --node NAME`: run this machine's node agent: a Celery worker on the
queue `node.NAME` (thread pool, so the supervisor shares state with the tasks). It needs Redis
(REDIS_URL / CELERY_BROKER_URL), not the database: it never loads Django."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys


def main(argv=None) -> int:
    from workers.agent.config import AgentConfig
    from workers.state_dir import make_private

    parser = argparse.ArgumentParser(prog="python -m workers.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--node", default=None, help="node name (default: $SWITCHYARD_NODE or the host name)")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = AgentConfig.from_env(args.node)
    # Replica logs, specs and pid files are this user's alone; the replicas inherit the umask.
    make_private(config.state_dir)

    from celery import Celery
    from celery.signals import worker_shutdown

    from workers.agent import tasks
    from workers.agent.node import NodeAgent, set_agent
    from workers.protocol.broker import survive_broker_loss_with_tasks_in_flight
    from workers.protocol.control import node_queue

    # No Django fixup: with DJANGO_SETTINGS_MODULE in the environment (make run sets it for
    # every process), Celery would load the control plane's settings into the agent.
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    survive_broker_loss_with_tasks_in_flight()
    app = Celery("switchyard-agent", broker=config.broker_url, fixups=[])
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a broker outage is waited out, never fatal
        worker_hijack_root_logger=False,
    )
    tasks.register(app)
    agent = NodeAgent(config, app)
    set_agent(agent)
    worker_shutdown.connect(lambda **kwargs: agent.shutdown(), weak=False)
    # Until Celery's worker installs its own handlers (its warm shutdown then runs the one
    # above), a SIGTERM would kill the agent outright and leave its replicas running unwatched.
    signal.signal(signal.SIGTERM, lambda signum, frame: (agent.shutdown(), sys.exit(0)))
    agent.start()
    app.worker_main(
        ["worker", "-Q", node_queue(config.node), "-P", "threads", "-c", "4", "-n", f"agent@{config.node}",
         "--loglevel", args.loglevel, "--without-gossip", "--without-mingle", "--without-heartbeat"]
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
