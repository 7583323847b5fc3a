"""`manage.py bench_platform MODEL_DIR MAX_NUM_SEQS`: the database side of the gateway
benchmark's throwaway platform (workers/bench/gateway.py), printed as one JSON line. No
reconciler runs there: the replica row is made ready here and its process started by the bench."""

import json

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from controlplane.catalog.services import register_model, validate_model
from controlplane.deployments.models import Deployment, Replica
from controlplane.gateway.services import create_api_key


class Command(BaseCommand):
    help = "Create the gateway benchmark's model, deployment, ready replica row and API key."

    def add_arguments(self, parser):
        parser.add_argument("model_dir")
        parser.add_argument("max_num_seqs", type=int)

    def handle(self, *args, model_dir, max_num_seqs, **options):
        call_command("migrate", "--noinput", verbosity=0)
        user = get_user_model().objects.create_user("bench")
        model = validate_model(register_model(name="bench", source=model_dir).pk)
        dep = Deployment.objects.create(slug="bench", model=model, replicas=0, max_num_seqs=max_num_seqs)
        replica = Replica.objects.create(deployment=dep, state="ready")
        _, key = create_api_key(name="bench", owner=user)
        self.stdout.write(json.dumps({"replica_id": replica.pk, "api_key": key}))
