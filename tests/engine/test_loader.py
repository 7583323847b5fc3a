import json
import shutil
import subprocess
import sys

import pytest

from workers.engine import LLM, ModelLoadError, RequestError, SamplingParams, UnsupportedArchitectureError
from workers.engine.loader import weight_files


def test_sharded_checkpoint_loads_and_matches_single_file(checkpoint_factory, llama_dir):
    sharded = checkpoint_factory("llama", max_shard_size="100KB")
    assert len(weight_files(sharded)) > 1
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a = LLM(str(sharded)).generate({"prompt_token_ids": [1, 2, 3, 4]}, params)[0].outputs[0].token_ids
    b = LLM(str(llama_dir)).generate({"prompt_token_ids": [1, 2, 3, 4]}, params)[0].outputs[0].token_ids
    assert a == b


@pytest.fixture
def broken(tmp_path, llama_dir):
    target = tmp_path / "model"
    shutil.copytree(llama_dir, target)
    return target


def test_missing_directory_or_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        LLM(str(tmp_path / "nowhere"))


def test_unsupported_architecture_is_named(broken):
    cfg = json.loads((broken / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel"):
        LLM(str(broken))


def test_invalid_config_json(broken):
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="invalid JSON"):
        LLM(str(broken))


def test_missing_weights(broken):
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        LLM(str(broken))


def test_truncated_weights(broken):
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        LLM(str(broken))


def test_wrong_shape_names_the_tensor(broken):
    cfg = json.loads((broken / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="mlp"):
        LLM(str(broken))


def test_bad_requests(llama_dir):
    llm = LLM(str(llama_dir), max_model_len=64)
    with pytest.raises(RequestError, match="context is 64"):
        llm.generate({"prompt_token_ids": list(range(64))})
    with pytest.raises(RequestError, match="empty"):
        llm.generate({"prompt_token_ids": []})
    with pytest.raises(RequestError, match="out of range"):
        llm.generate({"prompt_token_ids": [10**6]})


def test_eos_stops_generation(llama_dir):
    llm = LLM(str(llama_dir))
    free = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    first = free[0].outputs[0].token_ids[0]
    llm.engine.eos_token_ids = (first,)
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=20))[0].outputs[0]
    assert out.token_ids == [first] and out.finish_reason == "stop"


def test_engine_stats_report_load_and_prefix_hits(llama_dir):
    """The figures a replica will report in its heartbeat."""
    llm = LLM(str(llama_dir), block_size=4)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(10, 30))}
    llm.generate(prompt, params)
    llm.generate(prompt, params)
    stats = llm.engine.stats()
    assert stats["prefix_cache_queries"] == 10 and stats["prefix_cache_hits"] == 4  # 2nd run: 4 of 5 blocks
    assert stats["generated_tokens"] == 6
    assert stats["running"] == stats["waiting"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_building_a_model_skips_its_random_initialisation(checkpoint_factory, arch):
    """Models are built on the meta device and filled from the checkpoint. An op that computes
    there (nn.Embedding's normal_, a rotary table, to_empty's empty_like) runs torch's Python
    reference, whose first call imports torch._dynamo or sympy: up to 2 s of CPU at every
    replica's and every rank's start, for nothing (workers/engine/meta_device.py)."""
    script = f"""
import sys
from workers.engine import LLM, SamplingParams
llm = LLM({str(checkpoint_factory(arch))!r}, dtype="float32")
[out] = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0))
print(len(out.outputs[0].token_ids), "torch._dynamo" in sys.modules, "sympy" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3", "False", "False"], done.stdout
