"""`manage.py serve_model PATH` (controlplane/deployments/serve_directory.py): a directory the engine
cannot serve is refused with the reason; a good one is registered, validated and deployed under
its own name, with an API key that may call it; a second run reuses all three; names taken by
another directory are refused. Waiting for a replica and the call through the gateway: tests/
integration/test_make_run_model.py."""

from __future__ import annotations

import io
import json
import shutil

import pytest
from django.core.management import CommandError, call_command

from controlplane.catalog.models import Model
from controlplane.deployments.how_to_call import deployment_name
from controlplane.deployments.models import Deployment
from controlplane.gateway.models import ApiKey
from controlplane.gateway.services import authenticate, create_api_key
from workers.demo import MODEL_DIR

pytestmark = pytest.mark.django_db


@pytest.fixture
def roots(tmp_path, settings):
    """A model root and a state directory of the test's own."""
    settings.MODEL_ROOTS = [str(tmp_path / "models")]
    settings.STATE_DIR = tmp_path / "state"
    settings.STATE_DIR.mkdir()
    (tmp_path / "models").mkdir()
    return tmp_path / "models"


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("admin", password="pw")


def model_dir(root, name="Tiny.Llama-7B"):
    return shutil.copytree(MODEL_DIR, root / name)


def serve(*args) -> str:
    out = io.StringIO()
    call_command("serve_model", *map(str, args), "--no-wait", "--url", "http://gw.example:8000", stdout=out)
    return out.getvalue()


def printed_key(output: str) -> str:
    return output.split('api_key="')[1].split('"')[0]


def test_a_directory_is_served_under_its_own_name_with_a_key_that_may_call_it(roots, admin):
    directory = model_dir(roots)
    output = serve(directory)
    assert deployment_name(directory) == "tiny-llama-7b"
    dep = Deployment.objects.get(slug="tiny-llama-7b")
    assert dep.model.name == "tiny-llama-7b" and dep.model.source == str(directory.resolve())
    assert dep.model.status == Model.Status.READY and dep.model.checksum  # validated now, not later
    assert dep.desired_state == "running" and dep.replicas == 1 and dep.model.architecture == "LlamaForCausalLM"
    assert "registered model 'tiny-llama-7b'" in output and "created deployment 'tiny-llama-7b'" in output
    key = printed_key(output)
    assert authenticate(key).name == "serve-model"
    # How to call it: curl and the openai client, with the base URL, the key and the name.
    assert 'curl http://gw.example:8000/v1/chat/completions -H "Authorization: Bearer ' + key in output
    assert 'OpenAI(base_url="http://gw.example:8000/v1", api_key="' + key in output
    assert '"model": "tiny-llama-7b"' in output and 'model="tiny-llama-7b"' in output
    kept = roots.parent / "state" / "serve_model.json"
    assert json.loads(kept.read_text()) == {"api_key": key} and kept.stat().st_mode & 0o777 == 0o600


def test_a_second_run_reuses_the_model_the_deployment_and_the_key(roots, admin):
    directory = model_dir(roots)
    first = serve(directory)
    Deployment.objects.update(desired_state="stopped")
    second = serve(directory)
    assert "reusing deployment 'tiny-llama-7b'" in second and "started deployment" in second
    assert "registered" not in second and "created" not in second
    assert printed_key(second) == printed_key(first)
    assert (Model.objects.count(), Deployment.objects.count(), ApiKey.objects.count()) == (1, 1, 1)
    assert Deployment.objects.get().desired_state == "running"
    # Settings given again are applied to the same deployment.
    serve(directory, "--max-model-len", "128", "--max-num-seqs", "8")
    assert (Deployment.objects.get().max_model_len, Deployment.objects.get().max_num_seqs) == (128, 8)


def test_make_runs_key_is_used_while_it_works(roots, admin):
    _, secret = create_api_key(name="make-run", owner=admin)
    (roots.parent / "state" / "run.json").write_text(json.dumps({"api_key": secret, "url": "http://x/"}))
    assert printed_key(serve(model_dir(roots))) == secret
    # A key restricted to other deployments is not one for this: a new key.
    other = Deployment.objects.create(slug="other", model=Model.objects.get())
    _, restricted = create_api_key(name="r", owner=admin, allowed_deployments=[other])
    (roots.parent / "state" / "run.json").write_text(json.dumps({"api_key": restricted}))
    fresh = printed_key(serve(roots / "Tiny.Llama-7B"))
    assert fresh not in (secret, restricted) and authenticate(fresh) is not None


def test_a_name_taken_by_another_directory_is_refused_and_name_chooses_another(roots, admin):
    serve(model_dir(roots))
    elsewhere = roots / "other"
    elsewhere.mkdir()
    twin = model_dir(elsewhere)
    with pytest.raises(CommandError, match=r"a model named 'tiny-llama-7b' is already registered from .*--name"):
        serve(twin)
    serve(twin, "--name", "twin")
    assert Deployment.objects.get(slug="twin").model.source == str(twin)
    # A deployment of that name serving another model is not taken over either.
    Deployment.objects.create(slug="taken", model=Model.objects.get(name="twin"))
    third = model_dir(roots, "third")
    with pytest.raises(CommandError, match=r"deployment 'taken' already serves model 'twin'"):
        serve(third, "--name", "taken")


def test_a_directory_that_cannot_be_served_is_refused_with_the_reason(roots, admin, tmp_path):
    good = model_dir(roots)

    def broken(name, edit):
        directory = model_dir(roots, name)
        edit(directory)
        return directory

    no_config = broken("no-config", lambda d: (d / "config.json").unlink())
    no_weights = broken("no-weights", lambda d: (d / "model.safetensors").unlink())
    config = json.loads((good / "config.json").read_text())
    unsupported = json.dumps({**config, "architectures": ["GPT2LMHeadModel"]})
    gpt2 = broken("gpt2", lambda d: (d / "config.json").write_text(unsupported))
    outside = model_dir(tmp_path, "outside")
    (roots / "a-file").write_text("x")
    for path, message in [
        (roots / "missing", r"missing: no such directory"),
        (roots / "a-file", r"a-file is not a directory"),
        (no_config, r"cannot be served: .*no config\.json"),
        (no_weights, r"cannot be served: .*no model\.safetensors"),
        (gpt2, r"cannot be served: .*architecture 'GPT2LMHeadModel' is not supported; supported: LlamaForCausalLM"),
        (outside, r"is not under a model root \(MODEL_ROOTS: .*add .* to MODEL_ROOTS"),
    ]:
        with pytest.raises(CommandError, match=message):
            serve(path)
    assert not Model.objects.exists() and not Deployment.objects.exists()


def test_without_an_admin_user_it_says_how_to_make_one(roots, django_user_model):
    with pytest.raises(CommandError, match="no admin user yet"):
        serve(model_dir(roots))
    django_user_model.objects.create_user("ops")
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        serve(roots / "Tiny.Llama-7B", "--user", "nobody")
    serve(roots / "Tiny.Llama-7B", "--user", "ops")
    assert ApiKey.objects.get().owner.username == "ops"


def test_waiting_ends_with_what_the_replicas_are_doing(roots, admin):
    """No node agent here: nothing is placed, and the wait says so once its time is up."""
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"no replica of 'tiny-llama-7b' was ready within 1 s .*--wait-timeout"):
        call_command("serve_model", str(model_dir(roots)), "--wait-timeout", "1", stdout=out)
    assert "waiting for a replica of 'tiny-llama-7b' to be ready (up to 1 s)" in out.getvalue()
