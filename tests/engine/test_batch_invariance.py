"""A request's greedy output does not depend on what else shares its batches."""

from workers.engine import LLM, SamplingParams

PROMPTS = [list(range(10, 10 + n)) for n in (3, 17, 40, 9, 64, 25)]


def test_outputs_same_alone_and_in_a_batch_with_chunking_and_preemption(llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    alone_llm = LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4, enable_prefix_caching=False)
    alone = [alone_llm.generate({"prompt_token_ids": p}, params)[0].outputs[0].token_ids for p in PROMPTS]

    # 16-token step budget forces chunked prefill; 40 blocks of 4 cannot hold all six requests
    # at full length (6 x ~22 blocks), so running requests are preempted and recomputed.
    tight = LLM(
        str(llama_dir),
        device="cpu",
        dtype="float32",
        block_size=4,
        num_kv_blocks=40,
        max_num_batched_tokens=16,
        max_num_seqs=6,
    )
    together = tight.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in together] == alone
    # Everything is released at the end.
    assert tight.engine.block_manager.num_free_blocks == 40
