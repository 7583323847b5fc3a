from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.common.models import ManagementToken
from controlplane.common.services import PREFIX_LENGTH, revoke_tokens


class Command(BaseCommand):
    help = "Revoke USERNAME's management API tokens (all, or the one whose start is given), or list them."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "--prefix", help=f"revoke only the token starting with this (at least {PREFIX_LENGTH} characters)"
        )
        parser.add_argument("--list", dest="list_only", action="store_true", help="list the tokens; revoke none")

    def handle(self, username, prefix=None, list_only=False, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        if list_only:
            for t in ManagementToken.objects.filter(user=user):
                state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "live"
                used = f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never"
                self.stdout.write(
                    f"{t.prefix}…  {t.name or '-'}  created {t.created_at:%Y-%m-%d %H:%M}  last used {used}  {state}"
                )
            return
        if prefix is not None and len(prefix) < PREFIX_LENGTH:
            raise CommandError(f"--prefix needs the token's first {PREFIX_LENGTH} characters (as `--list` shows them)")
        count = revoke_tokens(user, prefix=prefix)
        self.stdout.write(f"revoked {count} token{'s' if count != 1 else ''} of {username}")
