"""`python -m workers.agent --node NAME`: run this machine's node agent (a Celery worker on the
queue `node.NAME`, thread pool so the supervisor shares state with the tasks)."""

import argparse
import os
import socket
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.agent", description=__doc__)
    parser.add_argument(
        "--node",
        default=os.environ.get("SWITCHYARD_NODE") or socket.gethostname().split(".")[0],
        help="node name (default: $SWITCHYARD_NODE or the host name)",
    )
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    os.environ["SWITCHYARD_NODE"] = args.node
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.config.settings")
    import django

    django.setup()
    from controlplane.config.celery_app import app
    from controlplane.inventory.services import node_queue

    app.worker_main(
        [
            "worker",
            "-Q",
            node_queue(args.node),
            "-P",
            "threads",
            "-c",
            "4",
            "-n",
            f"agent@{args.node}",
            "--loglevel",
            args.loglevel,
            "--without-gossip",
            "--without-mingle",
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
