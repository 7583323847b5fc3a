import pytest
import redis
from django.conf import settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.inventory.services import register_node
from tests.engine.checkpoints import build_checkpoint


@pytest.fixture(autouse=True, scope="session")
def _clean_redis():
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("ops", password="pw-ops", is_staff=True)


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("viewer", password="pw-viewer")


def bearer_client(u) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {Token.objects.get_or_create(user=u)[0].key}")
    return client


@pytest.fixture
def staff_client(staff):
    return bearer_client(staff)


@pytest.fixture
def user_client(user):
    return bearer_client(user)


@pytest.fixture
def anon_client():
    return APIClient()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("cp-model"), "llama")


@pytest.fixture
def node(db):
    return register_node(
        name="node-a",
        hostname="host-a",
        devices=[{"index": i, "kind": "cuda", "name": "H200", "memory_total": 141 << 30} for i in range(2)],
    )
