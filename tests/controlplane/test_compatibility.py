"""Settings the engine does not run together (controlplane/deployments/compatibility.py): each row
of the table is a 400 naming both settings when a deployment is created with it or patched into
it (from either side, the stored row unchanged), its neighbours are accepted, and the engine's
own check refuses the row's example and runs the neighbours, so the table cannot drift from it."""

import dataclasses
import json
import subprocess
import sys

import pytest

from controlplane.catalog.models import Model
from controlplane.common.errors import DomainError
from controlplane.deployments.compatibility import RULES, ModelShape, refusal
from controlplane.deployments.models import CachePolicy, Deployment
from controlplane.deployments.replica_specs import kv_tiers_spec
from controlplane.deployments.services import create_deployment
from workers.protocol.model_files import SUPPORTED_ARCHITECTURES

pytestmark = pytest.mark.django_db

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
DEEPSEEK = {
    **LLAMA,
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_key_value_heads": 4,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 24,
}


def int4(ignore: list[str]) -> dict:
    """compressed-tensors pack-quantized, as Kimi K2 ships it."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "ignore": ignore,
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
    }


# What Kimi K2 keeps dense: the head, attention, shared experts and the dense first layer's MLP.
KIMI_DENSE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:model\.layers\.0\.mlp\..*"]
# Model directories (config.json alone: the rules read nothing else), by name.
CONFIGS = {
    "llama": LLAMA,  # the neighbour every row's model is swapped for: it splits over 2, 3 or 4 ranks
    "two-layers": {**LLAMA, "num_hidden_layers": 2},
    "gemma": {**LLAMA, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3"},
    "fp8": {**LLAMA, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16]}},
    "heads-6": {**LLAMA, "hidden_size": 96, "num_attention_heads": 6},
    "kv-3": {**LLAMA, "hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 192},
    "mlp-129": {**LLAMA, "intermediate_size": 129},
    "deepseek": DEEPSEEK,
    "experts-6": {**DEEPSEEK, "n_routed_experts": 6},
    "shared-30": {**DEEPSEEK, "moe_intermediate_size": 30},
    # Kimi K2's layout: int4 routed experts only, which each rank loads whole.
    "kimi-int4": {**DEEPSEEK, "quantization_config": int4(KIMI_DENSE)},
}
# One refused combination per row at least: (model, tensor_parallel, pipeline_parallel, KV tiers).
REFUSED = [
    ("llama", 2, 1, True),
    ("llama", 1, 2, True),
    ("gemma", 2, 1, False),
    ("gemma", 1, 2, False),
    ("fp8", 2, 1, False),
    ("fp8", 1, 2, False),
    ("heads-6", 4, 1, False),
    ("kv-3", 2, 1, False),
    ("experts-6", 4, 1, False),
    ("shared-30", 4, 1, False),
    ("mlp-129", 2, 1, False),
    ("two-layers", 1, 3, False),
]
RULE_IDS = [f"{i}-{rule.setting}-{rule.other}-{rule.engine.split()[0]}" for i, rule in enumerate(RULES)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat-models")  # under the tests' MODEL_ROOTS
    for name, config in CONFIGS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    return root


def unsaved_model(model_dirs, name: str) -> Model:
    return Model(name=name, source=str(model_dirs / name), architecture=CONFIGS[name]["architectures"][0])


TIERS = {"dram_tier_bytes": 1 << 20}


@pytest.fixture(scope="module")
def examples(model_dirs):
    """Each row's example: the first of REFUSED the table refuses by that row."""
    found = {}
    for model, tp, pp, tiers in REFUSED:
        data = {
            "model": unsaved_model(model_dirs, model),
            "tensor_parallel": tp,
            "pipeline_parallel": pp,
            "cache_policy": CachePolicy(name="tiers", **TIERS) if tiers else None,
        }
        hit = refusal(data)
        assert hit is not None, f"{(model, tp, pp, tiers)} is refused by no row"
        found.setdefault(RULES.index(hit[0]), (model, tp, pp, tiers))
    return found


@pytest.fixture
def catalog(model_dirs):
    for name, config in CONFIGS.items():
        Model.objects.create(
            name=name, source=str(model_dirs / name), architecture=config["architectures"][0], status="ready"
        )
    CachePolicy.objects.create(name="tiers", **TIERS)
    CachePolicy.objects.create(name="plain")


def body(model: str, tp: int, pp: int, tiers: bool) -> dict:
    return {
        "slug": "d",
        "model": model,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "cache_policy": "tiers" if tiers else "plain",
    }


def example_of(examples, i: int) -> tuple:
    assert i in examples, f"row {RULE_IDS[i]} has no example in REFUSED: add one"
    return examples[i]


def neighbours(rule, example: tuple) -> dict[str, tuple]:
    """The example with one of the row's two settings moved off the refused value, by that setting."""
    model, tp, pp, tiers = example
    off = {
        "tensor_parallel": (model, 1, pp, tiers),
        "pipeline_parallel": (model, tp, 1, tiers),
        "model": ("llama", tp, pp, tiers),
        "cache_policy": (model, tp, pp, False),
    }
    return {name: off[name] for name in (rule.setting, rule.other)}


def value(name: str, example: tuple):
    """The request's value of setting `name` in `example`."""
    return body(*example)[name]


@pytest.mark.parametrize("i", range(len(RULES)), ids=RULE_IDS)
def test_a_refused_combination_is_a_400_at_creation_naming_both_settings(staff_client, catalog, examples, i):
    rule, example = RULES[i], example_of(examples, i)
    response = staff_client.post("/api/v1/deployments/", body(*example), format="json")
    assert response.status_code == 400, response.json()
    says = response.json()[rule.setting][0]
    for name in (rule.setting, rule.other):
        assert name in says and str(value(name, example)) in says, says
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("i", range(len(RULES)), ids=RULE_IDS)
@pytest.mark.parametrize("side", ["setting", "other"])
def test_patching_one_setting_into_a_refused_combination_is_a_400_and_changes_nothing(
    staff_client, catalog, examples, i, side
):
    rule, example = RULES[i], example_of(examples, i)
    field = getattr(rule, side)
    start = neighbours(rule, example)[field]  # the example with `field` off: accepted
    created = staff_client.post("/api/v1/deployments/", body(*start), format="json")
    assert created.status_code == 201, created.json()
    before = staff_client.get("/api/v1/deployments/d/").json()

    response = staff_client.patch("/api/v1/deployments/d/", {field: value(field, example)}, format="json")
    assert response.status_code == 400, response.json()
    says = response.json()[field][0]
    assert rule.setting in says and rule.other in says, says
    after = staff_client.get("/api/v1/deployments/d/").json()
    assert after == before


@pytest.mark.parametrize("i", range(len(RULES)), ids=RULE_IDS)
def test_the_engine_refuses_every_row_and_runs_its_neighbours(model_dirs, examples, i):
    """The engine's own check (ParallelConfig.validate, before any rank starts) on the same settings."""
    from workers.engine.errors import RequestError

    rule, example = RULES[i], example_of(examples, i)
    with pytest.raises(RequestError, match=rule.engine):
        engine_check(*example)
    for neighbour in neighbours(rule, example).values():
        engine_check(*neighbour)


def engine_check(model: str, tp: int, pp: int, tiers: bool) -> None:
    from workers.engine.config import EngineConfig
    from workers.engine.parallel.config import ParallelConfig

    kv_tiers = kv_tiers_spec(CachePolicy(name="tiers", **TIERS)).engine_config() if tiers else None
    ParallelConfig(tp, pp).validate(engine_model_config(CONFIGS[model]), EngineConfig(model="x", kv_tiers=kv_tiers))


def engine_model_config(raw: dict):
    """The engine's ModelConfig of `raw`; one of an architecture it does not load is read as a
    Llama's under that name (as the engine's own parallel tests do)."""
    from workers.engine.config import ModelConfig

    arch = raw["architectures"][0]
    if arch in SUPPORTED_ARCHITECTURES:
        return ModelConfig.from_dict(raw)
    return dataclasses.replace(ModelConfig.from_dict({**raw, "architectures": ["LlamaForCausalLM"]}), architecture=arch)


@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if c["architectures"][0] in SUPPORTED_ARCHITECTURES])
def test_the_model_shape_is_read_as_the_engine_reads_it(name):
    engine, shape = engine_model_config(CONFIGS[name]), ModelShape.from_config(CONFIGS[name])
    assert (shape.architecture, shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.intermediate_size) == (
        engine.architecture,
        engine.num_layers,
        engine.num_heads,
        engine.num_kv_heads,
        engine.intermediate_size,
    )
    assert (shape.mla, shape.quantization) == (engine.mla is not None, engine.quantization)
    if engine.moe is None:
        assert shape.moe is None
    else:
        assert {f.name: getattr(shape.moe, f.name) for f in dataclasses.fields(shape.moe)} == {
            f.name: getattr(engine.moe, f.name) for f in dataclasses.fields(shape.moe)
        }
        assert [shape.moe.is_moe_layer(i) for i in range(8)] == [engine.moe.is_moe_layer(i) for i in range(8)]


@pytest.mark.parametrize(
    ("model", "tp", "pp"),
    [("kimi-int4", 2, 1), ("kimi-int4", 1, 2), ("deepseek", 4, 1), ("llama", 4, 1), ("kv-3", 3, 1), ("llama", 2, 2)],
)
def test_what_the_engine_runs_in_parallel_is_accepted(staff_client, catalog, model, tp, pp):
    engine_check(model, tp, pp, False)
    response = staff_client.post("/api/v1/deployments/", body(model, tp, pp, False), format="json")
    assert response.status_code == 201, response.json()


def test_kv_tiers_turned_on_under_a_parallel_deployment_are_refused_on_the_policy(staff_client, catalog):
    assert staff_client.post("/api/v1/deployments/", body("llama", 2, 1, False), format="json").status_code == 201
    plain = CachePolicy.objects.get(name="plain")
    response = staff_client.patch(f"/api/v1/cache-policies/{plain.pk}/", TIERS, format="json")
    assert response.status_code == 400, response.json()
    says = response.json()["dram_tier_bytes"][0]
    assert "deployment 'd'" in says and "tensor_parallel is 2" in says and "cache_policy 'plain'" in says
    plain.refresh_from_db()
    assert plain.dram_tier_bytes == 0
    # Unused by a parallel deployment, the same change is taken.
    Deployment.objects.update(tensor_parallel=1)
    assert staff_client.patch(f"/api/v1/cache-policies/{plain.pk}/", TIERS, format="json").status_code == 200


def test_a_deployment_stored_in_a_refused_combination_can_still_be_changed_elsewhere(staff_client, catalog):
    """Stored before the row existed: what a request does not touch is not held against it."""
    dep = Deployment.objects.create(
        slug="old",
        model=Model.objects.get(name="llama"),
        tensor_parallel=2,
        cache_policy=CachePolicy.objects.get(name="tiers"),
    )
    assert staff_client.patch("/api/v1/deployments/old/", {"max_num_seqs": 8}, format="json").status_code == 200
    assert staff_client.post("/api/v1/deployments/old/scale/", {"replicas": 0}, format="json").status_code == 200
    tiers = CachePolicy.objects.get(name="tiers")
    renamed = staff_client.patch(f"/api/v1/cache-policies/{tiers.pk}/", {"routing": "round_robin"}, format="json")
    assert renamed.status_code == 200, renamed.json()
    # Moving off it is allowed; back onto it is not.
    assert staff_client.patch("/api/v1/deployments/old/", {"tensor_parallel": 1}, format="json").status_code == 200
    back = staff_client.patch("/api/v1/deployments/old/", {"tensor_parallel": 2}, format="json")
    assert back.status_code == 400 and "cache_policy 'tiers'" in back.json()["tensor_parallel"][0]
    dep.refresh_from_db()
    assert dep.tensor_parallel == 1


def test_deployments_created_outside_the_api_are_checked_the_same(catalog):
    """serve_model and the bootstrap create deployments through the same service."""
    data = {"slug": "d", "model": Model.objects.get(name="fp8"), "tensor_parallel": 2}
    with pytest.raises(DomainError, match="quantized weights") as err:
        create_deployment(data)
    assert err.value.field == "tensor_parallel"
    assert not Deployment.objects.exists()


def test_the_table_reads_no_engine_module():
    """The web process reads PARALLEL_ARCHITECTURES and quantized_non_expert_layers without torch
    or the engine (the engine imports them from the same torch-free module)."""
    code = (
        "import sys, workers.protocol.parallel;"
        "print('torch' in sys.modules or any(m.startswith('workers.engine') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
