"""Deployment settings the engine does not run together, refused with a 400 naming both when a
deployment is created or changed (and when a cache policy is changed under one), never found out
when its replicas fail to start.

`RULES` is the whole table. Each row names the setting the refusal is about, the other setting it
clashes with, when it applies, why (naming both), and `engine`: the words of the engine's own
refusal of the same combination, at the line cited beside the row. A test runs the engine's check
on an example of every row (tests/controlplane/test_compatibility.py), so the two cannot drift
apart; docs/operations.md shows the table. A row is checked only when a request sets one of its
two settings (a PATCH of one is checked against the stored other): a deployment stored before a
row existed can still be scaled, stopped or moved off the combination.

What a rule reads of the model comes from its config.json, as the engine reads it, without torch;
a model whose files are not on this machine (a hub id) is checked by its settings alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from controlplane.common.errors import DomainError
from controlplane.deployments.models import CachePolicy, Deployment
from controlplane.deployments.replica_specs import kv_tiers_spec
from controlplane.planner import services as planner
from workers.protocol.architectures import MLA_ARCHITECTURES
from workers.protocol.model_files import ModelDirectoryError
from workers.protocol.parallel import PARALLEL_ARCHITECTURES, quantized_non_expert_layers
from workers.protocol.quantization import QuantConfig, quantization_config


@dataclass(frozen=True)
class Experts:
    """What the engine's parallel checks read of DeepSeek-V3's experts (its MoEConfig)."""

    n_routed_experts: int
    n_shared_experts: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    moe_layer_freq: int

    def is_moe_layer(self, index: int) -> bool:
        return index >= self.first_k_dense_replace and index % self.moe_layer_freq == 0


@dataclass(frozen=True)
class ModelShape:
    """What `ParallelConfig.validate` reads of a model (the engine's ModelConfig), from config.json."""

    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    mla: bool
    moe: Experts | None
    quantization: QuantConfig | None

    @classmethod
    def from_config(cls, raw: dict) -> ModelShape | None:
        """As workers/engine/config.py's ModelConfig.from_dict reads it; None when it cannot (the
        engine refuses such a model whatever the deployment's settings)."""
        try:
            archs = raw.get("architectures") or [""]
            arch = str(archs[0])
            heads = int(raw["num_attention_heads"])
            mla = arch in MLA_ARCHITECTURES
            moe = None
            if mla:
                moe = Experts(
                    n_routed_experts=int(raw["n_routed_experts"]),
                    n_shared_experts=int(raw.get("n_shared_experts") or 0),
                    moe_intermediate_size=int(raw["moe_intermediate_size"]),
                    first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
                    moe_layer_freq=int(raw.get("moe_layer_freq") or 1),
                )
            return cls(
                architecture=arch,
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=heads if mla else int(raw.get("num_key_value_heads") or heads),
                intermediate_size=int(raw["intermediate_size"]),
                mla=mla,
                moe=moe,
                quantization=quantization_config(raw),
            )
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, ModelDirectoryError):
            return None


# A cache policy's fields that give its replicas KV tiers (replica_specs.kv_tiers_spec).
TIER_FIELDS = ("dram_tier_bytes", "disk_tier_bytes", "store_tier")


class Deployed:
    """The settings the rules read: a deployment's (stored, with what a request changes) and
    what its model's files and its cache policy say."""

    def __init__(self, data: dict):
        self.tensor_parallel = data.get("tensor_parallel") or 1
        self.pipeline_parallel = data.get("pipeline_parallel") or 1
        self.policy: CachePolicy | None = data.get("cache_policy")
        self.model_obj = data.get("model")

    @property
    def parallel(self) -> bool:
        return self.tensor_parallel * self.pipeline_parallel > 1

    @property
    def model(self) -> str:
        return self.model_obj.name if self.model_obj is not None else ""

    @property
    def cache_policy(self) -> str:
        return self.policy.name if self.policy is not None else ""

    @cached_property
    def kv_tiers(self) -> str:
        """The policy's fields that turn KV tiers on, as a replica's spec gets them ("" if none)."""
        spec = kv_tiers_spec(self.policy)
        if spec is None:
            return ""
        on = {"dram_tier_bytes": spec.dram_bytes, "disk_tier_bytes": spec.disk_bytes, "store_tier": spec.store_master}
        return ", ".join(name for name in TIER_FIELDS if on[name])

    @cached_property
    def shape(self) -> ModelShape | None:
        """The model as the engine reads it; None for one whose config.json is not here. Read
        only for a parallel replica: every rule on the model's shape is about splitting it."""
        if self.model_obj is None or not self.parallel:
            return None
        try:
            return ModelShape.from_config(planner.model_config(self.model_obj))
        except DomainError:  # a hub id, or a directory gone: the settings alone are checked
            return None

    @property
    def architecture(self) -> str:
        if self.model_obj is not None and self.model_obj.architecture:
            return self.model_obj.architecture
        return self.shape.architecture if self.shape else ""

    @property
    def quantized_layer(self) -> str:
        """The first layer the engine would have to slice quantized ("" when none)."""
        layers = quantized_non_expert_layers(self.shape) if self.shape else []
        return layers[0] if layers else ""

    @property
    def shared_width(self) -> int:
        moe = self.shape.moe if self.shape else None
        return moe.moe_intermediate_size * moe.n_shared_experts if moe else 0

    @property
    def dense_layers(self) -> bool:
        """Whether some layer has a dense MLP of intermediate_size (every layer of a dense model)."""
        moe = self.shape.moe
        return moe is None or any(not moe.is_moe_layer(i) for i in range(self.shape.num_layers))


@dataclass(frozen=True)
class Rule:
    setting: str  # what the refusal is about (reported under it unless a request set only `other`)
    other: str  # the setting it clashes with
    when: Callable[[Deployed], bool]
    reason: str  # str.format(d=Deployed): names both settings and their values
    engine: str  # the engine's words for the same refusal


def _split(size: int, tp: int) -> bool:
    return size % tp != 0


_PARALLEL_ONLY = "replicas of one device run it: set tensor_parallel and pipeline_parallel to 1"
RULES: tuple[Rule, ...] = (
    # ParallelConfig.validate (workers/engine/parallel/config.py)
    *(
        Rule(
            size,
            "cache_policy",
            lambda d, size=size: getattr(d, size) > 1 and d.kv_tiers,
            f"KV tiers are not built yet with {size} > 1: cache_policy {{d.cache_policy!r}} turns on "
            f"{{d.kv_tiers}} and {size} is {{d.{size}}}; choose a cache policy without KV tiers, or {size} 1",
            "KV tiers with tensor/pipeline parallelism are not built yet",
        )
        for size in ("tensor_parallel", "pipeline_parallel")
    ),
    # ParallelConfig.validate (workers/engine/parallel/config.py)
    *(
        Rule(
            size,
            "model",
            lambda d, size=size: getattr(d, size) > 1 and d.architecture not in ("", *PARALLEL_ARCHITECTURES),
            f"{size} > 1 is not built yet for model {{d.model!r}} (architecture {{d.architecture}}): {size} is "
            f"{{d.{size}}}, and parallel replicas run {', '.join(PARALLEL_ARCHITECTURES)}; {_PARALLEL_ONLY}",
            "tensor/pipeline parallelism is not built yet for",
        )
        for size in ("tensor_parallel", "pipeline_parallel")
    ),
    # ParallelConfig.validate (workers/engine/parallel/config.py)
    *(
        Rule(
            size,
            "model",
            lambda d, size=size: getattr(d, size) > 1 and d.quantized_layer,
            f"model {{d.model!r}} has int4 / fp8 quantized weights outside its routed experts (first: "
            f"{{d.quantized_layer}}), which are not built yet with {size} > 1 ({size} is {{d.{size}}}; only "
            f"quantized routed experts are, as Kimi K2 ships them); {_PARALLEL_ONLY}, or deploy dense weights",
            "quantized weights with tensor/pipeline parallelism are not built yet",
        )
        for size in ("tensor_parallel", "pipeline_parallel")
    ),
    # ParallelConfig.validate (workers/engine/parallel/config.py): each rank holds an equal share
    Rule(
        "tensor_parallel",
        "model",
        lambda d: d.shape and _split(d.shape.num_heads, d.tensor_parallel),
        "the {d.shape.num_heads} attention heads of model {d.model!r} do not split over tensor_parallel="
        "{d.tensor_parallel}; choose a tensor_parallel that divides them",
        "attention heads do not split over tensor_parallel_size",
    ),
    Rule(
        "tensor_parallel",
        "model",
        lambda d: (
            d.shape
            and not d.shape.mla  # MLA's latent cache is replicated
            and _split(d.shape.num_kv_heads, d.tensor_parallel)
            and _split(d.tensor_parallel, d.shape.num_kv_heads)
        ),
        "the {d.shape.num_kv_heads} KV heads of model {d.model!r} neither split over nor replicate evenly onto "
        "tensor_parallel={d.tensor_parallel}; choose a tensor_parallel that divides them or that they divide",
        "KV heads neither split over nor replicate evenly onto tensor_parallel_size",
    ),
    Rule(
        "tensor_parallel",
        "model",
        lambda d: d.shape and d.shape.moe and _split(d.shape.moe.n_routed_experts, d.tensor_parallel),
        "the {d.shape.moe.n_routed_experts} routed experts of model {d.model!r} do not split over tensor_parallel="
        "{d.tensor_parallel}; choose a tensor_parallel that divides them",
        "routed experts do not split over tensor_parallel_size",
    ),
    Rule(
        "tensor_parallel",
        "model",
        lambda d: d.shape and d.shape.moe and _split(d.shared_width, d.tensor_parallel),
        "the shared-expert width {d.shared_width} of model {d.model!r} does not split over tensor_parallel="
        "{d.tensor_parallel}; choose a tensor_parallel that divides it",
        "shared-expert width",
    ),
    Rule(
        "tensor_parallel",
        "model",
        lambda d: d.shape and d.dense_layers and _split(d.shape.intermediate_size, d.tensor_parallel),
        "the MLP intermediate size {d.shape.intermediate_size} of model {d.model!r} does not split over "
        "tensor_parallel={d.tensor_parallel}; choose a tensor_parallel that divides it",
        "intermediate size",
    ),
    # ParallelConfig.validate (workers/engine/parallel/config.py)
    Rule(
        "pipeline_parallel",
        "model",
        lambda d: d.shape and d.pipeline_parallel > d.shape.num_layers,
        "the {d.shape.num_layers} layers of model {d.model!r} cannot fill pipeline_parallel={d.pipeline_parallel} "
        "stages; choose at most {d.shape.num_layers}",
        "layers cannot fill pipeline_parallel_size",
    ),
)


def refusal(data: dict, changed: set[str] | None = None) -> tuple[Rule, str] | None:
    """The first rule the deployment `data` (every field) breaks, with its reason, among the rules
    on a setting in `changed` (None: all, a new deployment); None when it runs."""
    d = Deployed(data)
    for rule in RULES:
        if changed is not None and not changed & {rule.setting, rule.other}:
            continue
        if rule.when(d):
            return rule, rule.reason.format(d=d)
    return None


def check_deployment(data: dict, changed: set[str] | None = None) -> None:
    """DomainError (a 400) when the deployment `data` is a combination the engine refuses,
    reported under the setting the request set (both are named in the message)."""
    found = refusal(data, changed)
    if found is None:
        return
    rule, reason = found
    field = rule.other if changed is not None and rule.setting not in changed else rule.setting
    raise DomainError(reason, field)


def check_cache_policy(policy: CachePolicy) -> None:
    """DomainError when a change to `policy` gives a deployment that uses it a combination the
    engine refuses (KV tiers on a parallel deployment), reported under the tier field set."""
    if policy.pk is None:
        return
    stored = CachePolicy.objects.filter(pk=policy.pk).first()
    if stored is not None and kv_tiers_spec(stored) == kv_tiers_spec(policy):
        return  # what its replicas get is unchanged
    for dep in policy.deployments.select_related("model").order_by("slug"):
        if dep.engine == Deployment.Engine.SIM and kv_tiers_spec(policy) is not None:
            field = next((name for name in TIER_FIELDS if getattr(policy, name)), "prefix_caching")
            raise DomainError(
                f"deployment {dep.slug!r} uses this cache policy and runs the simulated engine, "
                "which does not simulate KV tiers yet",
                field,
            )
        data = {
            "tensor_parallel": dep.tensor_parallel,
            "pipeline_parallel": dep.pipeline_parallel,
            "model": dep.model,
            "cache_policy": policy,
        }
        found = refusal(data, {"cache_policy"})
        if found is not None:
            field = next((name for name in TIER_FIELDS if getattr(policy, name)), "prefix_caching")
            raise DomainError(f"deployment {dep.slug!r} uses this cache policy: {found[1]}", field)
