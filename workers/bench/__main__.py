"""`python -m workers.bench <name> [--json] [options]`"""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.bench", description=__doc__)
    sub = parser.add_subparsers(dest="name", required=True)
    eng = sub.add_parser("engine", help="engine throughput, latency and prefix-cache TTFT vs transformers")
    eng.add_argument("--model", help="HF model directory (default: random SmolLM-135M-shaped checkpoint)")
    eng.add_argument("--device", default="cpu")
    eng.add_argument("--dtype", default="float32")
    eng.add_argument("--quick", action="store_true", help="fewer tokens (for smoke runs)")
    eng.add_argument("--no-hf", action="store_true", help="skip the transformers baselines")
    eng.add_argument("--json", action="store_true", help="print only the JSON line")
    qu = sub.add_parser("quant", help="resident weight bytes and decode tok/s: dense vs int4 vs fp8 weights")
    qu.add_argument("--device", default="cpu")
    qu.add_argument("--quick", action="store_true", help="fewer tokens (for smoke runs)")
    qu.add_argument("--json", action="store_true", help="print only the JSON line")
    gw = sub.add_parser("gateway", help="latency the serving path adds per token; concurrent streams held")
    gw.add_argument("--model", help="HF model directory (default: the demo model)")
    gw.add_argument("--threads", type=int, default=1, help="torch threads of the replica and the engine baseline")
    gw.add_argument("--tokens", type=int, default=128, help="tokens per latency request")
    gw.add_argument("--repeat", type=int, default=5, help="latency requests per side")
    gw.add_argument("--streams", default="100,200,400", help="concurrency levels, comma-separated")
    gw.add_argument("--stream-tokens", type=int, default=32, help="tokens per concurrent stream")
    gw.add_argument("--json", action="store_true", help="print only the JSON line")
    pd = sub.add_parser("pd", help="prefill/decode disaggregation vs colocated on the same cores and trace")
    pd.add_argument("--model", help="HF model directory with >= 2.3k context (default: a random checkpoint)")
    pd.add_argument("--requests", type=int, default=40)
    pd.add_argument("--rate", type=float, default=1.5, help="mean arrivals per second (Poisson)")
    pd.add_argument("--long-fraction", type=float, default=0.5, help="share of 1-2k-token prompts")
    pd.add_argument("--seed", type=int, default=0)
    pd.add_argument("--chunk", type=int, default=512, help="per-step token budget (prefill chunk), both setups")
    pd.add_argument(
        "--local-prefill-tokens",
        type=int,
        default=256,
        help="the decode replica prefills shorter prompts itself (the product default)",
    )
    pd.add_argument("--json", action="store_true", help="print only the JSON line")
    ch = sub.add_parser("chaos", help="steady load while replicas, the agent, the control worker and Redis fail")
    ch.add_argument("--clients", type=int, default=20, help="concurrent looping clients during the faults")
    ch.add_argument("--tokens", type=int, default=24, help="tokens per request of the steady load")
    ch.add_argument(
        "--faults",
        default="replica_kill,replica_hang,agent_kill,control_kill,redis_outage",
        help="which faults, in order, comma-separated",
    )
    ch.add_argument("--hang-seconds", type=float, default=5.0, help="REPLICA_HANG_SECONDS for the stack")
    ch.add_argument("--streams", type=int, default=1000, help="concurrent streams held at the end (0: skip)")
    ch.add_argument("--stream-tokens", type=int, default=16, help="tokens per concurrent stream")
    ch.add_argument("--keep", action="store_true", help="keep the state directory and logs")
    ch.add_argument("--json", action="store_true", help="print only the JSON line")
    ca = sub.add_parser("cache", help="prompt-cache hit rate and TTFT of each routing policy on an agent trace")
    ca.add_argument(
        "--policies",
        default="round_robin,least_loaded,session,kv_aware,session+kv_aware",
        help="routing policies to replay the trace under, in order, comma-separated",
    )
    ca.add_argument("--sessions", type=int, help="root sessions of the trace (default: the trace's own)")
    ca.add_argument("--seed", type=int, default=13, help="the trace's seed")
    ca.add_argument("--quick", action="store_true", help="a tiny trace (for smoke runs)")
    ca.add_argument(
        "--restart", action="store_true", help="scale to 0 and back between policies instead of relabelling the tokens"
    )
    ca.add_argument("--keep", action="store_true", help="keep the state directory and logs")
    ca.add_argument("--json", action="store_true", help="print only the JSON line")
    sp = sub.add_parser(
        "spec", help="speculative decoding (none / ngram / eagle3 / auto) on the demo model, batch 1, 8 and 32"
    )
    sp.add_argument("--model", default=None, help="target model directory (default: the demo model)")
    sp.add_argument("--draft", default=None, help="EAGLE-3 draft head directory (default: workers/demo/draft)")
    sp.add_argument(
        "--methods",
        default="none,ngram,eagle3,auto",
        help="comma-separated, of none (the baseline), ngram, eagle3, ngram-measured, eagle3-measured, auto",
    )
    sp.add_argument("-k", "--num-speculative-tokens", dest="k", type=int, default=3, help="drafts per step")
    sp.add_argument("--rounds", type=int, help="rounds of every method (default 7, --quick 1)")
    sp.add_argument("--threads", type=int, default=1, help="torch threads, the same for every engine")
    sp.add_argument("--seed", type=int, default=1405, help="the workloads' corpus seed (the model trained on 0)")
    sp.add_argument("--quick", action="store_true", help="few prompts, one warm-up pass and one round (for smoke runs)")
    sp.add_argument(
        "--no-stack", dest="stack", action="store_false", help="leave out the make run stack run (JSON stack: null)"
    )
    sp.add_argument("--stack-seconds", type=float, default=40.0, help="seconds measured per deployment (stack run)")
    sp.add_argument("--stack-warmup", type=float, default=15.0, help="unmeasured seconds of load before each")
    sp.add_argument("--json", action="store_true", help="print only the JSON line")
    ti = sub.add_parser("tiers", help="KV tiers (DRAM, Mooncake Store, disk) on an agent trace; scale-out and restart")
    ti.add_argument(
        "--runs",
        default="device,dram,store,disk,scale_out,restart,scale_out_device,restart_device",
        help="which runs, comma-separated",
    )
    ti.add_argument("--sessions", type=int, help="root sessions of the trace (default: the benchmark's own)")
    ti.add_argument("--seed", type=int, default=13, help="the trace's seed")
    ti.add_argument("--json", action="store_true", help="print only the JSON line")
    st = sub.add_parser("structured", help="decode tokens/s with and without a JSON-schema constraint, batch 1 and 8")
    st.add_argument("--model", help="HF model directory (default: the demo model)")
    st.add_argument("--threads", type=int, default=1, help="torch threads")
    st.add_argument("--rounds", type=int, default=5, help="rounds; tokens/s is the median")
    st.add_argument("--json", action="store_true", help="print only the JSON line")
    ml = sub.add_parser("mla", help="MLA: absorbed vs expanded decode attention; KV bytes per token vs GQA/MHA")
    ml.add_argument("--device", default="cpu")
    ml.add_argument("--dtype", default="float32")
    ml.add_argument("--heads", type=int, default=16, help="attention heads (16: DeepSeek-V3's 128 at TP=8)")
    ml.add_argument("--context", type=int, default=4096, help="tokens in each sequence's context")
    ml.add_argument("--batch", type=int, default=4, help="decoding sequences")
    ml.add_argument("--rounds", type=int, default=3)
    ml.add_argument("--repeat", type=int, default=1, help="steps timed per round and side")
    ml.add_argument("--json", action="store_true", help="print only the JSON line")
    sa = sub.add_parser("samples", help="n samples forked from shared prompt blocks vs n independent requests")
    sa.add_argument("--model", help="HF model directory (default: the demo model)")
    sa.add_argument("--device", default="cpu")
    sa.add_argument("--threads", type=int, default=1, help="torch threads")
    sa.add_argument("--n", type=int, default=8)
    sa.add_argument("--prompt-tokens", type=int, default=400)
    sa.add_argument("--max-tokens", type=int, default=64)
    sa.add_argument("--seed", type=int, default=0)
    sa.add_argument("--json", action="store_true", help="print only the JSON line")
    pa = sub.add_parser("parallel", help="tensor and pipeline parallelism: tp=1 vs tp=2 vs pp=2, one core per rank")
    pa.add_argument("--model", help="HF model directory (default: a random 8-layer checkpoint, 2k context)")
    pa.add_argument("--quick", action="store_true", help="a tiny model and a 256-token prompt (for smoke runs)")
    pa.add_argument("--json", action="store_true", help="print only the JSON line")
    pr = sub.add_parser("profile", help="fit the simulated engine's step-time profile to the real engine here")
    pr.add_argument("--model", help="HF model directory (default: the demo model)")
    pr.add_argument("--threads", type=int, default=1, help="torch threads (a replica's REPLICA_CPU_THREADS)")
    pr.add_argument("--rounds", type=int, default=3, help="timings per prefill length (the median)")
    pr.add_argument("--out", help="write the profile here (JSON), for --sim-profile or a deployment's sim_profile")
    pr.add_argument("--json", action="store_true", help="print only the JSON line")
    au = sub.add_parser("autoscale", help="the autoscaler against fixed replica counts on a simulated deployment")
    au.add_argument("--seconds", type=float, default=240, help="one swing of the load, low to high and back")
    au.add_argument("--low", type=float, default=0.5, help="requests/s at the ends of the swing")
    au.add_argument("--high", type=float, default=9.0, help="requests/s at its peak")
    au.add_argument("--seed", type=int, default=3)
    au.add_argument("--policies", default="static_peak,static_mean,autoscaled", help="which runs, comma-separated")
    au.add_argument("--keep", action="store_true", help="keep the state directory and logs")
    au.add_argument("--json", action="store_true", help="print only the JSON line")
    ba = sub.add_parser("batch", help="the Batch API on spare capacity beside interactive load; fair sharing")
    ba.add_argument("--lines", type=int, default=2000, help="lines of the batch run beside the interactive load")
    ba.add_argument("--calibration", type=float, default=20, help="seconds of the capacity measurement")
    ba.add_argument("--rate", type=float, default=1.0, help="interactive requests/s")
    ba.add_argument("--seconds", type=float, default=60, help="how long the interactive load runs")
    ba.add_argument("--fair-seconds", type=float, default=40, help="each fairness run's window")
    ba.add_argument("--seed", type=int, default=5)
    ba.add_argument("--fill", type=float, default=1.0, help="BATCH_FILL: the most of the slots a batch may fill")
    # 1.25: the bound on the interactive TTFT p90 beside a batch, as the deployment's SLO.
    ba.add_argument(
        "--slo",
        type=float,
        default=1.25,
        help="the deployment's TTFT SLO, as a multiple of the interactive load's TTFT p90 alone; "
        "0: no SLO (the batch takes BATCH_FILL of the slots)",
    )
    ba.add_argument("--chaos", action="store_true", help="kill a replica and the control worker mid-batch")
    ba.add_argument("--keep", action="store_true", help="keep the state directory and logs")
    ba.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if args.name == "batch":
        from workers.bench.batch import run

        return run(args)
    if args.name == "autoscale":
        from workers.bench.autoscale import run

        return run(args)
    if args.name == "profile":
        from workers.bench.profile import run

        return run(args)
    if args.name == "parallel":
        from workers.bench.parallel import run

        return run(args)
    if args.name == "samples":
        from workers.bench.samples import run

        return run(args)
    if args.name == "mla":
        from workers.bench.mla import run

        return run(args)
    if args.name == "structured":
        from workers.bench.structured import run

        return run(args)
    if args.name == "tiers":
        from workers.bench.tiers import run

        return run(args)
    if args.name == "spec":
        from workers.bench.spec import run

        return run(args)
    if args.name == "cache":
        from workers.bench.cache import run

        return run(args)
    if args.name == "chaos":
        from workers.bench.chaos import run

        return run(args)
    if args.name == "pd":
        from workers.bench.pd import run

        return run(args)
    if args.name == "quant":
        from workers.bench.quant import run

        return run(args)
    if args.name == "engine":
        from workers.bench.engine import run

        return run(args)
    if args.name == "gateway":
        from workers.bench.gateway import run

        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
