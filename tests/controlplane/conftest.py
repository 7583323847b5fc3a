import pytest

from controlplane.inventory.services import register_node


@pytest.fixture
def node(db):
    return register_node(
        name="node-a",
        hostname="host-a",
        devices=[{"index": i, "kind": "cuda", "name": "H200", "memory_total": 141 << 30} for i in range(2)],
    )
