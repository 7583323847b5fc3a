"""`make run` keeps what it made (scripts/bootstrap.py): the admin password and API key in
run.json are reused while they work; a key that no longer authenticates is replaced and said so,
never one revoked; a password the operator changed is left alone."""

import pytest
from django.contrib.auth import get_user_model

from controlplane.gateway.models import ApiKey
from controlplane.gateway.services import authenticate, create_api_key, revoke_api_key
from scripts.bootstrap import ensure_admin, ensure_api_key

pytestmark = pytest.mark.django_db


def _first_run() -> dict:
    user, password, notes = ensure_admin(None)
    key, key_notes = ensure_api_key(user, None)
    assert notes == ["created the admin user 'admin'"]
    assert key_notes == [f"created an API key ({key[:12]}…)"]
    return {"admin_user": "admin", "admin_password": password, "api_key": key}


def test_a_second_run_reuses_the_password_and_the_key():
    first = _first_run()
    user, password, notes = ensure_admin(first)
    key, key_notes = ensure_api_key(user, first)
    assert (password, key, notes, key_notes) == (first["admin_password"], first["api_key"], [], [])
    assert user.check_password(first["admin_password"]) and user.is_superuser
    assert authenticate(first["api_key"]) is not None
    assert ApiKey.objects.filter(owner=user).count() == 1


def test_a_key_that_no_longer_authenticates_is_rotated_and_said_so():
    first = _first_run()
    user = get_user_model().objects.get(username="admin")
    revoke_api_key(authenticate(first["api_key"]))
    key, notes = ensure_api_key(user, first)
    assert key != first["api_key"] and authenticate(key) is not None
    assert len(notes) == 1 and notes[0].startswith("ROTATED the API key") and first["api_key"][:12] in notes[0]


def test_a_key_limited_to_other_deployments_is_not_reused(model_dir):
    from controlplane.catalog.services import register_model
    from controlplane.deployments.services import create_deployment

    user, _, _ = ensure_admin(None)
    other = create_deployment({"slug": "other", "model": register_model(name="m", source=str(model_dir))})
    _, limited = create_api_key(name="app", owner=user, allowed_deployments=[other])
    key, notes = ensure_api_key(user, {"api_key": limited})
    assert key != limited and notes[0].startswith("ROTATED")
    assert authenticate(limited) is not None  # still the application's: never revoked here


def test_make_run_model_deploys_no_demo_and_checks_the_key_for_its_own_deployment(model_dir):
    """`make run MODEL=...` (bootstrap --serve NAME): the demo is neither registered nor deployed,
    and run.json's key is kept only if it may call NAME (serve_model deploys it next)."""
    from controlplane.catalog.models import Model
    from controlplane.catalog.services import register_model
    from controlplane.deployments.models import Deployment
    from controlplane.deployments.services import create_deployment
    from scripts.bootstrap import bootstrap

    first = bootstrap(None, serve="mine")
    assert not Model.objects.exists() and not Deployment.objects.exists()
    assert authenticate(first["api_key"]) is not None
    demo = create_deployment({"slug": "demo", "model": register_model(name="m", source=str(model_dir))})
    _, demo_only = create_api_key(name="app", owner=get_user_model().objects.get(), allowed_deployments=[demo])
    again = bootstrap({**first, "api_key": demo_only}, serve="mine")
    assert again["api_key"] != demo_only and again["notes"][0].startswith("ROTATED")
    assert Deployment.objects.get().desired_state == "running" and Model.objects.count() == 1


def test_a_password_the_operator_changed_is_left_alone():
    first = _first_run()
    user = get_user_model().objects.get(username="admin")
    user.set_password("the operator's own")
    user.save()
    user, password, notes = ensure_admin(first)
    assert password is None and "no longer works" in notes[0]
    assert user.check_password("the operator's own")


def test_without_a_run_json_an_existing_admin_gets_a_new_password():
    first = _first_run()
    user, password, notes = ensure_admin(None)
    assert password and password != first["admin_password"] and user.check_password(password)
    assert notes == ["set a new password for 'admin'"]


def test_a_wiped_database_gets_the_remembered_password_back():
    """run.json kept, database new (e.g. db.sqlite3 deleted): the same password, a new key."""
    remembered = {"admin_password": "remembered-pw", "api_key": "sy-" + "x" * 43}
    user, password, _ = ensure_admin(remembered)
    key, notes = ensure_api_key(user, remembered)
    assert password == "remembered-pw" and user.check_password("remembered-pw")
    assert key != remembered["api_key"] and notes[0].startswith("ROTATED")


def test_the_demo_speculates_with_auto_and_the_note_says_how_to_turn_it_off(tmp_path):
    from controlplane.catalog.models import Model
    from controlplane.deployments.models import Deployment
    from controlplane.deployments.services import update_deployment
    from scripts.bootstrap import ensure_demo
    from tests.engine.checkpoints import build_eagle3_head
    from workers.demo import MODEL_DIR

    user, _, _ = ensure_admin(None)
    [note] = ensure_demo(user, draft_dir=tmp_path / "no-draft")  # no head: prompt lookup alone
    assert "speculates with auto (prompt lookup," in note
    assert '{"speculative_method": "none", "draft_model": null}' in note
    demo = Deployment.objects.get(slug="demo")
    assert (demo.speculative_method, demo.speculative_k, demo.draft_model) == ("auto", 3, None)
    Deployment.objects.all().delete()
    head = build_eagle3_head(tmp_path / "draft", MODEL_DIR)
    [note] = ensure_demo(user, draft_dir=head)
    assert "prompt lookup or the demo's EAGLE-3 head" in note
    assert Model.objects.get(name="demo-draft").status == "ready"
    demo = Deployment.objects.get(slug="demo")
    assert (demo.speculative_method, demo.draft_model.name) == ("auto", "demo-draft")
    # the note's way off is a valid edit (method none with a draft_model set would be refused)
    turned_off = update_deployment(demo, {"speculative_method": "none", "draft_model": None})
    assert (turned_off.speculative_method, turned_off.draft_model) == ("none", None)


@pytest.mark.parametrize(
    "earlier", [("eagle3", 3, "demo-draft"), ("none", 3, None)], ids=["eagle3 (defaults 1)", "none (defaults 2)"]
)
def test_a_demo_an_earlier_run_set_up_is_moved_onto_auto_once(tmp_path, earlier):
    from controlplane.catalog.models import Model
    from controlplane.deployments.models import Deployment
    from controlplane.deployments.services import update_deployment
    from scripts.bootstrap import DEMO_DEFAULTS, ensure_demo
    from tests.engine.checkpoints import build_eagle3_head
    from workers.demo import MODEL_DIR

    user, _, _ = ensure_admin(None)
    head = build_eagle3_head(tmp_path / "draft", MODEL_DIR)
    ensure_demo(user, draft_dir=head)
    method, k, draft = earlier
    earlier = {"speculative_method": method, "speculative_k": k, "draft_model": draft and Model.objects.get(name=draft)}
    update_deployment(Deployment.objects.get(slug="demo"), earlier)  # as a run before DEMO_DEFAULTS 3 left it
    generation = Deployment.objects.get(slug="demo").generation
    [note] = ensure_demo(user, draft_dir=head, defaults=DEMO_DEFAULTS - 1)
    demo = Deployment.objects.get(slug="demo")
    assert (demo.speculative_method, demo.draft_model.name) == ("auto", "demo-draft") and "auto" in note
    assert demo.generation == generation + 1  # running replicas roll onto it
    # Set so again after that (the run.json says so): the operator's choice stays.
    update_deployment(demo, earlier)
    assert ensure_demo(user, draft_dir=head, defaults=DEMO_DEFAULTS) == []
    assert Deployment.objects.get(slug="demo").speculative_method == method


def test_a_draft_head_that_does_not_fit_is_named_and_the_demo_speculates_without_it(tmp_path, model_dir):
    from controlplane.deployments.models import Deployment
    from scripts.bootstrap import ensure_demo
    from tests.engine.checkpoints import build_eagle3_head

    user, _, _ = ensure_admin(None)
    head = build_eagle3_head(tmp_path / "draft", model_dir)  # for another model (vocabulary 320)
    unusable, note = ensure_demo(user, draft_dir=head)
    assert unusable.startswith("the draft head in") and "does not fit" in unusable
    assert "speculates with auto (prompt lookup," in note
    demo = Deployment.objects.get(slug="demo")
    assert (demo.speculative_method, demo.draft_model) == ("auto", None)


def test_speculation_the_operator_chose_for_the_demo_is_left_alone(tmp_path):
    from controlplane.deployments.models import Deployment
    from controlplane.deployments.services import update_deployment
    from scripts.bootstrap import ensure_demo

    user, _, _ = ensure_admin(None)
    ensure_demo(user, draft_dir=tmp_path / "no-draft")
    update_deployment(Deployment.objects.get(slug="demo"), {"speculative_method": "none", "speculative_k": 2})
    assert ensure_demo(user, draft_dir=tmp_path / "no-draft") == []
    assert Deployment.objects.get(slug="demo").speculative_method == "none"


def test_a_demo_an_earlier_run_gave_up_on_is_tried_again(tmp_path):
    """A run whose replicas kept failing spends the demo's failure budget; the next run (the
    operator fixed what failed) starts it afresh instead of waiting for replicas never placed."""
    from django.utils import timezone

    from controlplane.deployments.models import Deployment
    from scripts.bootstrap import ensure_demo

    user, _, _ = ensure_admin(None)
    ensure_demo(user, draft_dir=tmp_path / "no-draft")
    reason = "3 replicas of generation 1 failed (the failure budget is 3)"
    Deployment.objects.filter(slug="demo").update(failed_at=timezone.now(), failed_reason=reason)
    assert ensure_demo(user, draft_dir=tmp_path / "no-draft") == [
        f"the demo deployment had given up in an earlier run ({reason}); trying again"
    ]
    demo = Deployment.objects.get(slug="demo")
    assert (demo.failed_at, demo.failed_reason, demo.desired_state) == (None, "", "running")
    assert demo.failure_budget_reset_at is not None
    assert ensure_demo(user, draft_dir=tmp_path / "no-draft") == []  # nothing to say the next time
