import pytest

from tests.engine.checkpoints import build_checkpoint


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """Build (once per session) a tiny checkpoint of an architecture; returns its directory."""
    made = {}

    def make(arch: str = "llama", **kwargs):
        key = (arch, tuple(sorted(kwargs.items())))
        if key not in made:
            made[key] = build_checkpoint(tmp_path_factory.mktemp(arch), arch, **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def llama_dir(checkpoint_factory):
    return checkpoint_factory("llama")
