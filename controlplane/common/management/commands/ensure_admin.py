import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Create the first admin user from DJANGO_SUPERUSER_USERNAME, DJANGO_SUPERUSER_PASSWORD and "
        "DJANGO_SUPERUSER_EMAIL, unless a user of that name exists (it and its password are then left "
        "alone). Run after `migrate` on every deploy (the Kubernetes migrate Job does), so it must be "
        "a no-op the second time, unlike `createsuperuser --noinput`."
    )

    def handle(self, **options):
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME", "").strip()
        if not username:
            self.stdout.write("DJANGO_SUPERUSER_USERNAME is not set: no admin user created")
            return
        users = get_user_model().objects
        if users.filter(username=username).exists():
            self.stdout.write(f"the user {username!r} exists: left as it is")
            return
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD", "")
        if not password:
            raise CommandError(f"DJANGO_SUPERUSER_PASSWORD is not set: cannot create the admin user {username!r}")
        users.create_superuser(username=username, email=os.environ.get("DJANGO_SUPERUSER_EMAIL", ""), password=password)
        self.stdout.write(f"created the admin user {username!r}")
