"""The engine reads only files inside the model directory: an index entry or a symlink that
leads out of it is refused, even when the file it points at is a valid shard."""

import json
import shutil

import pytest

from workers.engine import LLM, ModelLoadError
from workers.engine.loader import iter_tensors
from workers.protocol.model_files import model_file, weight_files
from workers.protocol.tokenizer import Tokenizer


@pytest.fixture
def sharded(tmp_path, checkpoint_factory):
    """A copy of a sharded checkpoint in tmp_path/model, and a spare copy of its first shard
    outside it (tmp_path/outside.safetensors): a valid target to escape to."""
    source = checkpoint_factory("llama", max_shard_size="100KB")
    target = tmp_path / "model"
    shutil.copytree(source, target)
    index = json.loads((target / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    shutil.copy(target / first, tmp_path / "outside.safetensors")
    return target, first


def _point_shard_at(model, shard: str, entry: str) -> None:
    path = model / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["weight_map"] = {name: (entry if f == shard else f) for name, f in index["weight_map"].items()}
    path.write_text(json.dumps(index))


@pytest.mark.parametrize("entry", ["../outside.safetensors", "sub/../../outside.safetensors", "ABSOLUTE"])
def test_loader_refuses_index_entries_outside_the_directory(sharded, entry):
    model, first = sharded
    entry = str(model.parent / "outside.safetensors") if entry == "ABSOLUTE" else entry
    _point_shard_at(model, first, entry)
    with pytest.raises(ModelLoadError, match="is outside the model directory"):
        next(iter_tensors(model))
    with pytest.raises(ModelLoadError, match="is outside the model directory"):
        LLM(str(model))


def test_loader_refuses_a_shard_symlinked_out(sharded):
    model, first = sharded
    (model / first).unlink()
    (model / first).symlink_to(model.parent / "outside.safetensors")
    with pytest.raises(ModelLoadError, match="is outside the model directory"):
        LLM(str(model))


def test_symlinks_inside_the_directory_are_followed(sharded):
    model, first = sharded
    (model / "shards").mkdir()
    (model / first).rename(model / "shards" / first)
    (model / first).symlink_to(model / "shards" / first)
    assert (model / "shards" / first) in weight_files(model)


def test_same_message_whether_the_outside_target_exists(tmp_path, sharded):
    model, first = sharded
    (model / first).unlink()
    (model / first).symlink_to(tmp_path / "outside.safetensors")  # exists
    with pytest.raises(ModelLoadError) as existing:
        weight_files(model)
    (model / first).unlink()
    (model / first).symlink_to(tmp_path / "no-such-file.safetensors")
    with pytest.raises(ModelLoadError) as missing:
        weight_files(model)
    assert str(existing.value) == str(missing.value)
    assert "outside" in str(existing.value) and "no-such-file" not in str(missing.value)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_tokenizer_and_generation_config_symlinked_out_are_refused(tmp_path, llama_dir, name):
    model = tmp_path / "model"
    shutil.copytree(llama_dir, model)
    outside = tmp_path / name
    outside.write_text((model / name).read_text() if (model / name).exists() else "{}")
    (model / name).unlink(missing_ok=True)
    (model / name).symlink_to(outside)
    with pytest.raises(ModelLoadError, match="is outside the model directory"):
        Tokenizer(model) if name.startswith("tokenizer") else LLM(str(model))


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../x", "a/../../x", "nul\0byte"])
def test_model_file_refuses_names_that_leave_the_directory(tmp_path, name):
    with pytest.raises(ModelLoadError, match="is outside the model directory"):
        model_file(tmp_path, name)
