// A plan as POST /api/v1/plan/ answers it, for the tests.
import type { Plan } from "./plan";

// Kimi K2.5 with INT4 experts on 8 x 80 GB, as POST /api/v1/plan/ answers it.
export const KIMI: Plan = {
  model: "kimi", architecture: "KimiK25ForConditionalGeneration", text_architecture: "DeepseekV3ForCausalLM",
  attention: "mla", quantization: "int4-experts", quantization_source: "config", dtype: "bfloat16",
  kv_cache_dtype: "bfloat16", tensor_parallel: 8, pipeline_parallel: 1, device_memory_bytes: 80e9,
  device_memory_source: "request", memory_fraction: 1, context_tokens: 262144, params_total: 1026879376368,
  params_active: 32861500928, weight_bytes_total: 595147639776, weight_bytes_per_device: 77124881376,
  kv_bytes_per_token: 70272, kv_bytes_per_token_per_device: 70272, usable_bytes_per_device: 80e9,
  free_bytes_per_device: 2875118624, fits: true, max_kv_tokens: 40914, max_batch_at_context: 0,
  attention_data_parallel: { max_kv_tokens: 327312, max_kv_tokens_replicated_attention: 0 }, notes: ["how"],
};
