"""The capacity planner for the API and for deployment validation: find the config (a registered
model's config.json or one given), the device memory (given, or the inventory's), and compute the
plan with `capacity` (pure arithmetic, torch-free)."""

from __future__ import annotations

import logging

from django.conf import settings

from controlplane.catalog import validation
from controlplane.catalog.models import Model
from controlplane.common.errors import DomainError
from controlplane.planner import capacity
from controlplane.planner.selectors import cuda_nodes
from workers.protocol.model_files import read_config

log = logging.getLogger(__name__)

# The deployment fields that change whether its replicas fit their devices.
FIT_FIELDS = {"model", "tensor_parallel", "pipeline_parallel", "dtype"}


def model_config(model: Model) -> dict:
    """`model`'s config.json, read from its directory (under MODEL_ROOTS, as at registration)."""
    if model.source_type != Model.Source.LOCAL:
        raise DomainError(
            f"model {model.name!r} is a hub id: its config.json is not on this machine; send the config instead",
            "model",
        )
    try:
        return read_config(validation.check_under_roots(model.source, settings.MODEL_ROOTS))
    except (validation.ModelDirectoryError, OSError) as exc:
        raise DomainError(f"cannot read model {model.name!r}'s config.json: {exc}"[:400], "model") from exc


def find_model(reference: str) -> Model:
    """A registered model by name, or by id."""
    model = Model.objects.filter(name=reference).first()
    if model is None and reference.isdigit() and len(reference) < 19:
        model = Model.objects.filter(pk=int(reference)).first()
    if model is None:
        raise DomainError(f"no registered model named {reference!r}"[:200], "model")
    return model


def plan(data: dict) -> dict:
    """A plan for the API: `data` is the request as the serializer validated it."""
    model = find_model(data["model"]) if data.get("model") is not None else None
    config = model_config(model) if model is not None else data["config"]
    memory, source = data.get("device_memory_bytes"), "request"
    if memory is None:
        nodes = cuda_nodes()
        if nodes:
            memory = nodes[0].memory_bytes
            source = f"inventory: node {nodes[0].name}'s {nodes[0].device_name} ({nodes[0].devices} CUDA devices)"
        else:
            source = "none: not given, and no node reports a CUDA device"
    layout = capacity.Layout(
        tensor_parallel=data.get("tensor_parallel", 1),
        pipeline_parallel=data.get("pipeline_parallel", 1),
        device_memory_bytes=memory,
        memory_fraction=data.get("memory_fraction", capacity.ENGINE_MEMORY_FRACTION),
        context_tokens=data.get("context_tokens"),
        quantization=data.get("quantization"),
        dtype=data.get("dtype", "auto"),
        kv_cache_dtype=data.get("kv_cache_dtype", "auto"),
    )
    try:
        result = capacity.plan(config, layout)
    except capacity.PlanError as exc:
        raise DomainError(exc.message, exc.field) from exc
    return {"model": model.name if model else None, "device_memory_source": source, **result}


def check_deployment_fits(data: dict, changed: set[str] | None = None) -> None:
    """Refuse (DomainError, a 400) a deployment whose replicas' weights cannot fit the CUDA devices
    they would be placed on, naming the numbers.

    Checked against the inventory: nodes with enough healthy CUDA devices for one replica
    (tensor_parallel x pipeline_parallel), each at its smallest device's memory (placement may hand
    a replica any of them) and the engine's memory fraction; one such node that fits is enough.
    Not checked, and left to placement: a model whose config.json is not on this machine (a hub
    id), a config the planner does not size, and deployments no CUDA node can take (they run on
    the CPU device, whose memory is shared by every replica of the node and swaps rather than
    fails, so a byte count there would refuse what runs)."""
    if changed is not None and not changed & FIT_FIELDS:
        return
    model = data.get("model")
    if model is None:
        return
    tp, pp = data.get("tensor_parallel") or 1, data.get("pipeline_parallel") or 1
    nodes = [n for n in cuda_nodes() if n.devices >= tp * pp]
    if not nodes:
        return
    try:
        config = model_config(model)
    except DomainError:
        return
    plans = []
    for node in nodes:
        layout = capacity.Layout(
            tp, pp, node.memory_bytes, capacity.ENGINE_MEMORY_FRACTION, dtype=data.get("dtype") or "auto"
        )
        try:
            result = capacity.plan(config, layout)
        except capacity.PlanError as exc:
            if exc.field in ("tensor_parallel", "pipeline_parallel"):
                raise DomainError(exc.message, exc.field) from exc
            log.info("deployment of %s: not planned (%s)", model.name, exc.message)
            return
        if result["fits"]:
            return
        plans.append((node, result))
    node, result = plans[0]  # the largest devices
    devices = tp * pp
    raise DomainError(
        f"model {model.name!r} does not fit on {devices} device{'s' * (devices > 1)} per replica (tensor_parallel "
        f"{tp} x pipeline_parallel {pp}, {result['quantization']} weights in {result['dtype']}): "
        f"{_gb(result['weight_bytes_per_device'])} of weights per device vs {_gb(result['device_memory_bytes'])} "
        f"x memory fraction {result['memory_fraction']} = {_gb(result['usable_bytes_per_device'])} usable on node "
        f"{node.name}'s {node.device_name} (the largest CUDA devices with room for a replica); spread it over more "
        "devices, quantize it, or use larger ones (POST /api/v1/plan/ shows the arithmetic)"
    )


def _gb(n: int) -> str:
    return f"{n:,} bytes ({n / 1e9:.2f} GB)"
