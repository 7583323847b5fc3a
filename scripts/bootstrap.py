"""`make run`'s set-up, in one Django start-up: migrate; the admin user, its password and an API
key, kept from the previous run while they still work; a management-API token for run.py's own
polling; the demo model and the `demo` deployment (not with `--serve NAME`: make run MODEL=...
serves that deployment instead).

`python -m scripts.bootstrap [--serve NAME]` reads what the previous run wrote to run.json (a JSON object, or
`null` when there is none) on stdin, so no secret is on a command line, and prints one JSON
line: the credentials to use and `notes`, what it changed that the operator should know.
"""

from __future__ import annotations

import json
import secrets
import sys

ADMIN = "admin"
KEY_NAME = "make-run"


def ensure_admin(previous: dict | None) -> tuple[object, str | None, list[str]]:
    """The admin user and its password. The one in run.json is kept; a user whose password was
    changed since keeps the new one (None: make run cannot show it). Only without a run.json
    is a password chosen."""
    from django.contrib.auth import get_user_model

    notes = []
    remembered = (previous or {}).get("admin_password")
    user, created = get_user_model().objects.get_or_create(username=ADMIN)
    user.is_staff = user.is_superuser = True
    if created or previous is None:
        password = remembered or secrets.token_urlsafe(12)
        user.set_password(password)
        notes.append(f"created the admin user {ADMIN!r}" if created else f"set a new password for {ADMIN!r}")
    elif remembered and user.check_password(remembered):
        password = remembered
    else:
        password = None
        notes.append(
            f"the {ADMIN!r} password in run.json no longer works (changed since?); left as it is: "
            f"`manage.py changepassword {ADMIN}` sets one"
        )
    user.save()
    return user, password, notes


def ensure_api_key(user, previous: dict | None, deployment: str = "demo") -> tuple[str, list[str]]:
    """The API key in run.json if the gateway still accepts it for `deployment` (the one make
    run serves); else a new one. A key is never revoked here: an application may be using it."""
    from controlplane.gateway.services import authenticate, create_api_key

    remembered = (previous or {}).get("api_key")
    if remembered:
        key = authenticate(remembered)
        allowed = key is not None and (
            not key.allowed_deployments.exists() or key.allowed_deployments.filter(slug=deployment).exists()
        )
        if allowed:
            return remembered, []
    _, secret = create_api_key(name=KEY_NAME, owner=user)
    if remembered:
        return secret, [
            f"ROTATED the API key: the one in run.json ({remembered[:12]}…) no longer authenticates "
            f"(revoked or deleted?); made a new one ({secret[:12]}…): give it to the applications that used the old one"
        ]
    return secret, [f"created an API key ({secret[:12]}…)"]


def _ready_model(name: str, directory, user):
    """The model registered from `directory` under `name`, validated; its status says if not ready."""
    from controlplane.catalog.models import Model
    from controlplane.catalog.services import register_model, validate_model

    model = Model.objects.filter(name=name).first() or register_model(name=name, source=str(directory), actor=user)
    return validate_model(model.pk)


# Speculation an earlier `make run` gave the demo: before deployments speculated (none, k 4),
# n-gram while there was no draft head, EAGLE-3 with the demo head, none again (DEMO_DEFAULTS 2).
# A demo made by a run before DEMO_DEFAULTS (run.json's `demo_defaults`) is moved onto the
# current default once; anything else, and anything after that, is the operator's choice and is
# left alone.
EARLIER_DEMO_SPECULATION = {("none", 4, None), ("ngram", 3, None), ("eagle3", 3, "demo-draft"), ("none", 3, None)}
# 3: the demo speculates with `auto` (prompt lookup or the demo's head, k chosen per step from
# what the replica measures, nothing where nothing pays): through make run at 32 clients it
# served 1.05x the requests/s of none (bench spec's stack run, issue 31), where the fixed EAGLE-3
# of DEMO_DEFAULTS 1 served 0.88x (issue 30).
DEMO_DEFAULTS = 3


def demo_draft_dir():
    from workers.demo import MODEL_DIR

    return MODEL_DIR.parent / "draft"  # `make demo-draft` trains it for the demo model


def demo_speculation(draft) -> dict:
    """The demo's speculation: `auto`, with the demo's draft head when there is a usable one."""
    return {"speculative_method": "auto", "speculative_k": 3, "draft_model": draft}


def speculation_note(draft) -> str:
    """What the demo's speculation is and how to turn it off (a note `make run` prints)."""
    drafter = "prompt lookup or the demo's EAGLE-3 head" if draft is not None else "prompt lookup"
    return (
        f"the demo deployment speculates with auto ({drafter}, guesses only where the replica measures "
        "that they pay); to turn it off, edit the demo in the console (Deployments) or PATCH "
        '/api/v1/deployments/demo/ with {"speculative_method": "none", "draft_model": null}'
    )


def demo_draft(user, model, draft_dir) -> tuple[object | None, list[str]]:
    """The demo's EAGLE-3 draft head in `draft_dir`, registered as `demo-draft`, when there is
    one that fits the demo model (the operator turns it on with one edit); else None, with a
    note saying why a head that is there was not usable."""
    from controlplane.catalog.services import check_draft
    from controlplane.common.errors import DomainError

    if not (draft_dir / "config.json").is_file():
        return None, []
    try:
        draft = _ready_model("demo-draft", draft_dir, user)
        if draft.status != "ready":
            raise DomainError(draft.status_message)
        check_draft(draft, model)
    except DomainError as exc:
        return None, [f"the draft head in {draft_dir} is not usable with the demo model ({exc})"]
    return draft, []


def ensure_demo(user, draft_dir=None, defaults: int = 0) -> list[str]:
    """The demo model registered and valid, its draft head registered (workers/demo/draft by
    default), and the `demo` deployment wanted running, speculating with `auto`. `defaults`: the
    DEMO_DEFAULTS of the run that last set up the demo (0: none or before). Returns notes."""
    from controlplane.deployments import services as deployments
    from controlplane.deployments.models import Deployment
    from workers.demo import MODEL_DIR

    model = _ready_model("demo", MODEL_DIR, user)
    if model.status != "ready":
        raise SystemExit(f"the demo model at {MODEL_DIR} is not usable: {model.status_message}")
    draft, notes = demo_draft(user, model, draft_dir or demo_draft_dir())
    demo = Deployment.objects.filter(slug="demo").first()
    speculation = demo_speculation(draft)
    if demo is None:
        deployments.create_deployment({"slug": "demo", "model": model, "replicas": 1, **speculation}, actor=user)
        return [*notes, speculation_note(draft)]
    current = (demo.speculative_method, demo.speculative_k, demo.draft_model.name if demo.draft_model else None)
    if defaults < DEMO_DEFAULTS and current in EARLIER_DEMO_SPECULATION:
        demo = deployments.update_deployment(demo, speculation, actor=user)
        notes.append(speculation_note(draft))
        if demo.desired_state == "running":
            deployments.restart(demo, actor=user)  # replicas still running roll onto it
    if demo.failed_at is not None:  # an earlier run's replicas kept failing: this run tries again
        notes.append(f"the demo deployment had given up in an earlier run ({demo.failed_reason}); trying again")
    if demo.desired_state != "running" or demo.failed_at is not None:
        deployments.start(demo, actor=user)  # a fresh failure budget
    return notes


def bootstrap(previous: dict | None, serve: str | None = None) -> dict:
    """`serve`: the deployment make run serves instead of the demo (`make run MODEL=...`, which
    deploys it next, through `manage.py serve_model`); the demo is then left as it is."""
    from controlplane.common.services import create_token, revoke_tokens

    user, password, notes = ensure_admin(previous)
    api_key, key_notes = ensure_api_key(user, previous, serve or "demo")
    if serve is None:
        notes += ensure_demo(user, defaults=int((previous or {}).get("demo_defaults") or 0))
    # run.py's own token for polling the API; only its hash is kept, so a fresh one each run
    # (tokens the operator made with create_token have other names and are left alone).
    revoke_tokens(user, name=KEY_NAME)
    _, token = create_token(user, name=KEY_NAME)
    return {
        "admin_user": ADMIN,
        "admin_password": password,
        "api_key": api_key,
        "token": token,
        "notes": notes + key_notes,
        "demo_defaults": DEMO_DEFAULTS if serve is None else int((previous or {}).get("demo_defaults") or 0),
    }


def main() -> int:
    import django

    django.setup()
    from django.core.management import call_command

    serve = sys.argv[sys.argv.index("--serve") + 1] if "--serve" in sys.argv else None
    previous = json.loads(sys.stdin.read() or "null")
    call_command("migrate", "--noinput", verbosity=0)
    print(json.dumps(bootstrap(previous if isinstance(previous, dict) else None, serve)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
