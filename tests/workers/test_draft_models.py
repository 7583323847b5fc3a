"""EAGLE-3 heads read without torch (workers/protocol/draft_models.py): a whole head that fits
its target passes; each way of not fitting is refused with a message naming it."""

from __future__ import annotations

import json

import pytest

from tests.engine.checkpoints import build_checkpoint, build_eagle3_head
from workers.protocol.draft_models import (
    Eagle3Spec,
    check_draft_dir,
    default_aux_layer_ids,
    read_eagle3,
)
from workers.protocol.model_files import ModelDirectoryError


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("target"), "llama", num_hidden_layers=4)


def test_a_head_built_for_its_target_fits(tmp_path, target):
    head = build_eagle3_head(tmp_path / "head", target, draft_vocab_size=200, aux_layer_ids=[0, 1, 3])
    spec = check_draft_dir(head, target)
    assert spec.draft_vocab_size == 200
    assert spec.vocab_size == 320
    assert spec.aux_layers(4) == (0, 1, 3)


def test_default_aux_layers_are_low_middle_high_and_inside_the_model():
    assert default_aux_layer_ids(32) == (1, 15, 28)
    assert default_aux_layer_ids(4) == (0, 1, 3)
    assert default_aux_layer_ids(2) == (0, 0, 1)


def test_a_head_for_another_vocabulary_is_refused(tmp_path, target):
    other = build_checkpoint(tmp_path / "other", "llama", vocab_size=400, num_hidden_layers=4)
    head = build_eagle3_head(tmp_path / "head", other)
    with pytest.raises(ModelDirectoryError, match="vocab_size is 400, the target's 320"):
        check_draft_dir(head, target)


def test_a_head_for_another_hidden_size_is_refused(tmp_path, target):
    other = build_checkpoint(tmp_path / "other", "llama", hidden_size=96, num_hidden_layers=4)
    head = build_eagle3_head(tmp_path / "head", other)
    with pytest.raises(ModelDirectoryError, match="hidden states of size 96, the target's are 64"):
        check_draft_dir(head, target)


def test_aux_layers_outside_the_target_are_refused(tmp_path, target):
    head = build_eagle3_head(tmp_path / "head", target, aux_layer_ids=[1, 2, 7])
    with pytest.raises(ModelDirectoryError, match=r"layers \[7\] are not layers of the target \(it has 4\)"):
        check_draft_dir(head, target)


def test_weights_that_disagree_with_the_config_are_refused(tmp_path, target):
    head = build_eagle3_head(tmp_path / "head", target, draft_vocab_size=200)
    config = json.loads((head / "config.json").read_text())
    config["draft_vocab_size"] = 256  # lm_head and d2t still hold 200 rows
    (head / "config.json").write_text(json.dumps(config))
    expected = r"lm_head.weight has shape \[200, 64\], the config implies \[256, 64\]"
    with pytest.raises(ModelDirectoryError, match=expected):
        read_eagle3(head)


def test_a_target_model_is_not_a_head(target):
    with pytest.raises(ModelDirectoryError, match="'LlamaForCausalLM' is not an EAGLE-3 head"):
        read_eagle3(target)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"draft_vocab_size": 999}, "draft_vocab_size 999 is larger than vocab_size 320"),
        ({"eagle_aux_hidden_state_layer_ids": [1, 2]}, "must be 3 layer indices"),
        ({"hidden_size": "64"}, "hidden_size must be a positive integer"),
    ],
)
def test_bad_configs_name_the_key(change, message):
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 320,
        **change,
    }
    with pytest.raises(ModelDirectoryError, match=message):
        Eagle3Spec.from_config(config)
