"""Suite-wide settings and fixtures. The triton interpreter must be chosen before any kernel
is defined, hence the environment set at import. This run's PostgreSQL and Redis are started
before Django reads its settings, by the plugin tests/support/services.py (pyproject.toml)."""

import os
from pathlib import Path

import pytest

from tests.support import lanes

os.environ.setdefault("TRITON_INTERPRET", "1")
# One compute thread per pytest worker (`make test` runs two, one per core): with torch's default
# of a thread per core, two workers' OpenMP threads spun waiting on each other, and the suite
# took 26% longer for a third more CPU. Set before torch loads; the processes tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    lanes.mark(items, Path(__file__).parent)
    # pytest -n (pytest-xdist, as `make test` runs it): its workers collect with numprocesses cleared.
    if getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        lanes.heavy_first(items)


@pytest.fixture(autouse=True, scope="session")
def _clean_redis():
    """The tests' Redis database (this run's own, or TEST_REDIS_URL's) starts empty."""
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.fixture(autouse=True, scope="session")
def _model_roots(tmp_path_factory):
    """The models the tests register live in pytest's temporary directory: a model root."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(MODEL_ROOTS=[*settings.MODEL_ROOTS, str(tmp_path_factory.getbasetemp())]):
        yield


@pytest.fixture(autouse=True)
def _fast_password_hashing(request):
    """Passwords hashed with MD5 first: PBKDF2's million rounds take 0.4 s per user a test makes
    on this CPU (hashes stored with it still check). Not for tests that start processes, where a
    web server may check a password stored here with the default hashers only."""
    if request.node.get_closest_marker("processes"):
        yield
        return
    from django.conf import settings
    from django.test import override_settings

    fast = ["django.contrib.auth.hashers.MD5PasswordHasher", *settings.PASSWORD_HASHERS]
    with override_settings(PASSWORD_HASHERS=fast):
        yield


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("ops", password="pw-ops", is_staff=True)


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("viewer", password="pw-viewer")


def bearer_client(u):
    from rest_framework.test import APIClient

    from controlplane.common.services import create_token

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {create_token(u)[1]}")
    return client


@pytest.fixture
def staff_client(staff):
    return bearer_client(staff)


@pytest.fixture
def user_client(user):
    return bearer_client(user)


@pytest.fixture
def anon_client():
    from rest_framework.test import APIClient

    return APIClient()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny random Llama checkpoint with tokenizer, as a model directory to register."""
    from tests.engine.checkpoints import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("cp-model"), "llama")
