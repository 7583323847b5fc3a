"""Deployments of the simulated engine (`engine: sim`, workers/sim): what they may set.

The simulated engine runs the real scheduler and KV cache with step times from a profile, for
fleet-size tests of the control plane (docs/operations.md, "The simulated engine"). What it does
not simulate yet is refused here with a 400 naming the setting, rather than accepted and ignored;
a profile is named here and sent whole in each replica's spec (replica_specs.profile_fields).
"""

from __future__ import annotations

from controlplane.common.errors import DomainError
from controlplane.deployments.models import CachePolicy, Deployment
from controlplane.deployments.replica_specs import kv_tiers_spec
from workers.sim.profile import shipped_profiles


def check(data: dict) -> None:
    """DomainError when the deployment `data` (every field) asks the simulated engine for what it
    does not simulate, or gives `sim_profile` to the real engine."""
    engine = data.get("engine", Deployment.Engine.REAL)
    profile = data.get("sim_profile") or ""
    if engine != Deployment.Engine.SIM:
        if profile:
            raise DomainError(
                "sim_profile is read by the simulated engine only: set engine 'sim', or clear it", "sim_profile"
            )
        return
    if profile and profile not in shipped_profiles():
        raise DomainError(f"no simulation profile {profile!r}: one of {shipped_profiles()}", "sim_profile")
    not_simulated = "is not simulated yet: the simulated engine (engine 'sim') runs colocated replicas of one device"
    if data.get("mode", Deployment.Mode.COLOCATED) != Deployment.Mode.COLOCATED:
        raise DomainError(f"mode {data['mode']!r} {not_simulated}", "mode")
    if data.get("speculative_method", Deployment.Speculative.NONE) != Deployment.Speculative.NONE:
        raise DomainError(f"speculative_method {data['speculative_method']!r} {not_simulated}", "speculative_method")
    for size in ("tensor_parallel", "pipeline_parallel"):
        if (data.get(size) or 1) > 1:
            raise DomainError(f"{size} {data[size]} {not_simulated}", size)
    policy: CachePolicy | None = data.get("cache_policy")
    if kv_tiers_spec(policy) is not None:
        raise DomainError(f"the KV tiers of cache_policy {policy.name!r} {not_simulated}", "cache_policy")
