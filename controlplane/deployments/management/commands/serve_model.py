import json
import os
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from controlplane.deployments import serve_directory
from controlplane.deployments.how_to_call import instructions


def default_url() -> str:
    """The gateway make run serves (run.json), else SWITCHYARD_URL, else port PORT (8000) here."""
    try:
        url = json.loads((settings.STATE_DIR / "run.json").read_text()).get("url")
    except (OSError, ValueError, AttributeError):
        url = None
    return url or os.environ.get("SWITCHYARD_URL") or f"http://127.0.0.1:{os.environ.get('PORT', '8000')}/"


class Command(BaseCommand):
    help = (
        "Serve the Hugging Face model directory PATH: register it, create (or reuse) a deployment named after it, "
        "wait until a replica answers, and print how to call it. Safe to run again. The stack must be running "
        "(`make run`): its node agent starts the replica."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="the model directory (config.json, tokenizer.json, *.safetensors)")
        parser.add_argument("--name", help="the deployment's (and model's) name; default: the directory's name")
        parser.add_argument(
            "--wait-timeout",
            type=float,
            default=300.0,
            help="seconds to wait for a replica to answer (default 300; raise it for a large model)",
        )
        parser.add_argument("--no-wait", action="store_true", help="register and deploy, and return at once")
        parser.add_argument("--url", help="the gateway's base URL (default: make run's, from run.json)")
        parser.add_argument("--user", help="who the model, deployment and API key belong to (default: admin)")
        parser.add_argument("--replicas", type=int, help="replicas (default 1)")
        parser.add_argument("--max-model-len", type=int, help="the context served (default: the model's)")
        parser.add_argument("--max-num-seqs", type=int, help="sequences a replica batches (default 64)")
        parser.add_argument("--dtype", help="auto (default), float32, float16 or bfloat16")
        parser.add_argument("--no-instructions", action="store_true", help="do not print how to call it")

    def say(self, message: str) -> None:
        self.stdout.write(f"[serve_model] {message}")
        self.stdout.flush()

    def handle(self, path, **options):
        url = options["url"] or default_url()
        url = url if url.endswith("/") else url + "/"
        deployment_options = {k: options[k] for k in serve_directory.DEPLOYMENT_OPTIONS}
        try:
            served = serve_directory.serve(path, options["name"], options["user"], deployment_options)
            for note in served.notes:
                self.say(note)
            name = served.deployment.slug
            if not options["no_wait"]:
                started = time.monotonic()
                self.say(f"waiting for a replica of {name!r} to be ready (up to {options['wait_timeout']:g} s)")
                serve_directory.wait_ready(served.deployment, options["wait_timeout"], self.say)
                if serve_directory.gateway_answers(url):
                    left = max(options["wait_timeout"] - (time.monotonic() - started), 10)
                    serve_directory.wait_answers(url, served.api_key, name, left)
                    self.say(f"{name!r} answered a completion through {url} after {time.monotonic() - started:.0f} s")
                else:
                    self.say(
                        f"{name!r} is ready, but no gateway answers at {url} (start it with `make run`, or give --url)"
                    )
        except serve_directory.ServeError as exc:
            raise CommandError(str(exc)) from None
        if not options["no_instructions"]:
            self.stdout.write("\n" + instructions(url, served.api_key, name))
