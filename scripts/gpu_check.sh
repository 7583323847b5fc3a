#!/usr/bin/env bash
# GPU check, for a machine lent with a CUDA device (about 5 minutes):
#   1. the triton kernels against their torch references on CUDA, fp32/fp16/bf16 (MLA decode again
#      on its own, then `bench mla` on the device);
#   2. engine parity tests on CUDA (fp32), then a short engine benchmark in bf16, then the
#      quantized-weights benchmark (the int4 / fp8 kernels inside the engine).
#   3. with two or more GPUs, TP=2 (NCCL) against TP=1.
# Usage: bash scripts/gpu_check.sh   (expects `make setup` done, or installs the venv itself)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q -r requirements.txt
fi
PY=.venv/bin/python
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
echo "== kernel tests on CUDA"
TRITON_INTERPRET=0 SWITCHYARD_TEST_DEVICE=cuda timeout 240 $PY -m pytest -q tests/engine/test_kernels.py
echo "== MLA: the absorbed decode kernel against its reference, then absorbed vs expanded (bf16)"
TRITON_INTERPRET=0 SWITCHYARD_TEST_DEVICE=cuda timeout 120 $PY -m pytest -q tests/engine/test_kernels.py -k mla
timeout 120 $PY -m workers.bench mla --device cuda --dtype bfloat16 --heads 128 --context 8192 --batch 8
echo "== engine benchmark (bf16, quick)"
timeout 240 $PY -m workers.bench engine --device cuda --dtype bfloat16 --quick --no-hf
echo "== quantized weights benchmark (int4 / fp8 triton kernels, quick)"
timeout 240 $PY -m workers.bench quant --device cuda --quick

echo "== tensor parallel TP=2 on CUDA (NCCL): greedy tokens equal TP=1's"
if [ "$($PY -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    timeout 300 $PY - <<'PY'
import tempfile
from pathlib import Path

from tests.engine.checkpoints import build_checkpoint
from workers.engine import LLM, SamplingParams

if __name__ == "__main__":
    model = str(build_checkpoint(Path(tempfile.mkdtemp()) / "llama", "llama"))
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (5, 40, 200)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    with LLM(model, device="cuda", dtype="float32") as one:
        ref = [o.outputs[0].token_ids for o in one.generate(prompts, params)]
    with LLM(model, device="cuda", dtype="float32", tensor_parallel_size=2) as two:
        got = [o.outputs[0].token_ids for o in two.generate(prompts, params)]
        print("rank memory:", two.engine.rank_memory())
    assert got == ref, (got, ref)
    print("TP=2 on CUDA: greedy tokens identical")
PY
else
    echo "(skipped: TP=2 needs two CUDA devices; this machine has fewer)"
fi
