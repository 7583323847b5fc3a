"""The self-contained spec a node agent starts a replica from, built from the database here
(the agent never reads it). Node-specific fields (Redis URL, KV transfer address, CPU threads
and KV budget, the KV tiers' local address) are left at their defaults: the agent fills them in
for its own machine."""

from __future__ import annotations

import logging

from django.conf import settings

from controlplane.deployments.models import CachePolicy, Deployment, Replica
from workers.protocol.replica import KVTiersSpec, ReplicaSpec, SpeculativeSpec
from workers.sim.profile import DEFAULT_PROFILE, ProfileError, load_profile

log = logging.getLogger(__name__)


def build_spec(replica: Replica) -> ReplicaSpec:
    deployment = replica.deployment
    policy = deployment.cache_policy
    devices = sorted(replica.devices.all(), key=lambda d: d.index)
    device = "cuda" if devices and devices[0].kind == "cuda" else "cpu"
    config = settings.SWITCHYARD
    return ReplicaSpec(
        replica_id=replica.pk,
        deployment=deployment.slug,
        model_dir=deployment.model.source,
        model_name=deployment.model.name,
        role=replica.role,
        device=device,
        dtype=deployment.dtype,
        block_size=policy.block_size if policy else 16,
        enable_prefix_caching=policy.prefix_caching if policy else True,
        max_num_seqs=deployment.max_num_seqs,
        fair_share=deployment.fair_share,
        max_model_len=deployment.max_model_len,
        kv_transfer_timeout=config["KV_TRANSFER_TIMEOUT"],
        local_prefill_tokens=config["PD_LOCAL_PREFILL_TOKENS"],
        speculative=speculative_spec(deployment, replica.role),
        kv_tiers=kv_tiers_spec(policy),
        tensor_parallel=deployment.tensor_parallel,
        pipeline_parallel=deployment.pipeline_parallel,
        engine=deployment.engine,
        sim_profile=profile_fields(deployment),
        cuda_devices=[d.index for d in devices if d.kind == "cuda"],
    )


def profile_fields(deployment: Deployment) -> dict | None:
    """The profile a simulated replica is timed by, sent whole in its spec (None: the real engine)."""
    if deployment.engine != Deployment.Engine.SIM:
        return None
    try:
        return load_profile(deployment.sim_profile or DEFAULT_PROFILE).to_dict()
    except ProfileError:  # a profile removed since the deployment was saved: the default one
        log.warning(
            "deployment %s: no simulation profile %r; using %s",
            deployment.slug,
            deployment.sim_profile,
            DEFAULT_PROFILE,
        )
        return load_profile(DEFAULT_PROFILE).to_dict()


def speculative_spec(deployment: Deployment, role: str) -> SpeculativeSpec | None:
    """The deployment's speculation for a replica of `role`: a prefill replica computes prompts
    only, so it never drafts (a disaggregated deployment speculates on its decode replicas)."""
    method = deployment.speculative_method
    if method == Deployment.Speculative.NONE or role == Replica.Role.PREFILL:
        return None
    draft = deployment.draft_model.source if deployment.draft_model is not None else None  # eagle3, auto
    return SpeculativeSpec(method=method, num_speculative_tokens=deployment.speculative_k, draft_model=draft)


def kv_tiers_spec(policy: CachePolicy | None) -> KVTiersSpec | None:
    """The policy's KV tiers (None when it has none), the store's address from this control
    plane's SWITCHYARD_KV_STORE_MASTER. Every role gets them: a prefill replica's cache is as
    real as a colocated one's."""
    if policy is None or not policy.prefix_caching:  # validate_kv_tiers refuses tiers without it
        return None
    master = settings.SWITCHYARD["KV_STORE_MASTER"] if policy.store_tier else ""
    if policy.store_tier and not master:  # the setting went away after the policy was saved
        log.warning(
            "cache policy %s asks for the KV store, but SWITCHYARD_KV_STORE_MASTER is not set: "
            "its replicas start without it",
            policy.name,
        )
    spec = KVTiersSpec(
        dram_bytes=policy.dram_tier_bytes,
        disk_path=policy.disk_tier_path if policy.disk_tier_bytes else "",
        disk_bytes=policy.disk_tier_bytes if policy.disk_tier_path else 0,
        store_master=master,
        store_metrics=settings.SWITCHYARD["KV_STORE_METRICS"] if master else "",
        min_prefix_tokens=policy.min_cached_prefix_tokens,
    )
    return spec if spec.dram_bytes or spec.disk_bytes or spec.store_master else None
