"""`python -m workers.replica --replica-id N [--spec FILE]`: run one engine replica.

The node agent's supervisor starts it with `SWITCHYARD_REPLICA_SPEC` pointing at the spec it
wrote (see workers.protocol.replica.ReplicaSpec); `--spec` does the same by hand.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.protocol.replica import ReplicaSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.replica", description=__doc__.splitlines()[0])
    parser.add_argument("--replica-id", type=int, required=True)
    parser.add_argument("--spec", type=Path, default=os.environ.get("SWITCHYARD_REPLICA_SPEC"))
    parser.add_argument("--engine", choices=("real", "sim"), help="overrides the spec's: sim is the simulated engine")
    parser.add_argument("--sim-profile", help="the simulated engine's profile: a shipped one's name or a file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("workers.replica")
    if args.spec is None or not Path(args.spec).is_file():
        parser.error(f"no replica spec: pass --spec FILE or set SWITCHYARD_REPLICA_SPEC (got {args.spec})")

    from workers.protocol.replica import ReplicaSpec

    spec = ReplicaSpec.from_json(Path(args.spec).read_text())
    if spec.replica_id != args.replica_id:
        parser.error(f"spec {args.spec} is for replica {spec.replica_id}, not {args.replica_id}")
    if args.engine == "sim" or (args.engine is None and spec.engine == "sim"):
        return serve_simulated(spec, args.sim_profile, log)

    import redis
    import torch

    from workers.engine.config import EngineConfig
    from workers.engine.errors import ModelLoadError, RequestError
    from workers.engine.llm_engine import LLMEngine
    from workers.replica.server import report_progress

    if spec.threads:
        torch.set_num_threads(spec.threads)
    client = redis.Redis.from_url(spec.redis_url, decode_responses=True)

    def progress(stage: str, fraction: float) -> None:
        log.info("loading: %s (%.0f%%)", stage, fraction * 100)
        report_progress(client, spec.replica_id, stage, fraction)

    config = EngineConfig(
        model=spec.model_dir,
        device=spec.device,
        dtype=spec.dtype,
        block_size=spec.block_size,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        enable_prefix_caching=spec.enable_prefix_caching,
        fair_share=spec.fair_share,
        kv_cache_bytes=spec.kv_cache_bytes,
        speculative_config=spec.speculative.engine_config() if spec.speculative else None,
        kv_tiers=spec.kv_tiers.engine_config() if spec.kv_tiers else None,
        tensor_parallel_size=spec.tensor_parallel,
        pipeline_parallel_size=spec.pipeline_parallel,
    )
    try:
        engine = LLMEngine(config, progress=progress)
    except (ModelLoadError, RequestError, OSError, ValueError) as exc:
        log.error("cannot load %s: %s", spec.model_dir, exc)
        return 2
    try:  # and then let go of the KV tiers' threads and store connection, however it ends
        return serve(spec, engine, client, log)
    finally:
        engine.close()


def serve_simulated(spec: ReplicaSpec, profile_name: str | None, log: logging.Logger) -> int:
    """The simulated engine (workers/sim) behind the same server: no torch, no weights."""
    import redis

    from workers.engine.errors import RequestError
    from workers.sim.engine import SimConfig, SimEngine
    from workers.sim.profile import DEFAULT_PROFILE, ProfileError, SimProfile, load_profile

    refused = {
        "role": spec.role != "colocated",
        "speculative": spec.speculative is not None,
        "kv_tiers": spec.kv_tiers is not None,
        "tensor_parallel": spec.tensor_parallel > 1,
        "pipeline_parallel": spec.pipeline_parallel > 1,
    }
    if any(refused.values()):
        log.error("the simulated engine does not simulate %s", ", ".join(k for k, v in refused.items() if v))
        return 2
    try:
        if profile_name is not None:
            profile = load_profile(profile_name)
        elif spec.sim_profile is not None:
            profile = SimProfile.from_dict(spec.sim_profile)
        else:
            profile = load_profile(DEFAULT_PROFILE)
        engine = SimEngine(SimConfig(
            model=spec.model_dir, profile=profile, block_size=spec.block_size,
            enable_prefix_caching=spec.enable_prefix_caching, max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens, max_model_len=spec.max_model_len,
            kv_cache_bytes=spec.kv_cache_bytes, fair_share=spec.fair_share,
        ))  # fmt: skip
    except (ProfileError, RequestError, OSError, ValueError) as exc:
        log.error("cannot simulate %s: %s", spec.model_dir, exc)
        return 2
    log.info("simulating %s (profile: %s)", spec.model_dir, profile.source or profile_name or "from the spec")
    return serve(spec, engine, redis.Redis.from_url(spec.redis_url, decode_responses=True), log)


def serve(spec: ReplicaSpec, engine, client, log: logging.Logger) -> int:
    """Serve until drained (0), or 2 when the replica cannot take its role."""
    from workers.replica.server import ReplicaServer

    server = ReplicaServer(spec, engine, client)
    if spec.role in ("prefill", "decode"):
        from workers.kvtransfer import KVTransferError
        from workers.kvtransfer.mooncake import MooncakeKV
        from workers.kvtransfer.ranks import GroupKV
        from workers.replica.disagg import Disaggregation

        try:
            if engine.parallel_group is not None:  # every rank moves its own shard
                kv = GroupKV(engine.parallel_group, spec.kv_host, spec.kv_protocol)
            else:
                kv = MooncakeKV(engine.runner.kv_cache, engine.kv_layout(), spec.kv_host, spec.kv_protocol)
        except KVTransferError as exc:
            log.error("cannot serve as %s: %s", spec.role, exc)
            return 2
        server.disagg = Disaggregation(server, kv, spec.kv_transfer_timeout)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
