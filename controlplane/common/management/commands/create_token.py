from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.common.services import create_token, revoke_tokens


class Command(BaseCommand):
    help = (
        "Create a management API token for USERNAME and print it, usable as `Authorization: Bearer <token>`. "
        "Only its hash is stored: it is shown this once."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label, to tell the user's tokens apart")
        parser.add_argument("--rotate", action="store_true", help="revoke the user's other tokens first")

    def handle(self, username, name="", rotate=False, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {username!r}; create one with `manage.py createsuperuser`") from None
        if rotate:
            revoke_tokens(user)
        _, secret = create_token(user, name=name)
        self.stdout.write(secret)
