// The capacity planner (POST /api/v1/plan/) as the deployment form uses it: the request built
// from the form's fields, and the plan's figures in words.

export type Plan = {
  model: string | null;
  architecture: string;
  text_architecture: string;
  attention: "mla" | "gqa" | "mha";
  quantization: string;
  quantization_source: string;
  dtype: string;
  kv_cache_dtype: string;
  tensor_parallel: number;
  pipeline_parallel: number;
  device_memory_bytes: number | null;
  device_memory_source: string;
  memory_fraction: number;
  context_tokens: number;
  params_total: number;
  params_active: number;
  weight_bytes_total: number;
  weight_bytes_per_device: number;
  kv_bytes_per_token: number;
  kv_bytes_per_token_per_device: number;
  usable_bytes_per_device: number | null;
  free_bytes_per_device: number | null;
  fits: boolean | null;
  max_kv_tokens: number | null;
  max_batch_at_context: number | null;
  attention_data_parallel: { max_kv_tokens: number | null; max_kv_tokens_replicated_attention: number | null } | null;
  notes: string[];
};

/** The form's fields for a plan; empty strings are "the default" (the config's, the inventory's). */
export type PlanFields = {
  model: string;
  tensor_parallel: number | string;
  pipeline_parallel: number | string;
  quantization: string; // "" = what the config says
  device_memory_gb: string; // "" = the inventory's largest CUDA devices
  memory_fraction: string;
  context_tokens: string; // "" = the model's context length
};

/** The request body, or null while there is no model to plan. */
export function planBody(f: PlanFields): Record<string, unknown> | null {
  if (!f.model) return null;
  const body: Record<string, unknown> = {
    model: f.model,
    tensor_parallel: Number(f.tensor_parallel) || 1,
    pipeline_parallel: Number(f.pipeline_parallel) || 1,
  };
  if (f.quantization) body.quantization = f.quantization;
  if (f.device_memory_gb.trim()) body.device_memory_bytes = Math.round(Number(f.device_memory_gb) * 1e9);
  if (f.memory_fraction.trim()) body.memory_fraction = Number(f.memory_fraction);
  if (f.context_tokens.trim()) body.context_tokens = Math.round(Number(f.context_tokens));
  return body;
}

/** 595147639776 → "595.15 GB", 7077888 → "7.08 MB" (decimal, as GPU memory is sold). */
export function gb(n: number | null | undefined): string {
  if (n === null || n === undefined) return "–";
  return Math.abs(n) >= 1e9 ? `${(n / 1e9).toFixed(2)} GB` : `${(n / 1e6).toFixed(2)} MB`;
}

/** 1026879376368 → "1.03 T"; 32861500928 → "32.86 B". */
export function count(n: number): string {
  if (n >= 1e12) return `${(n / 1e12).toFixed(2)} T`;
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(2)} M`;
  return n.toLocaleString("en-US");
}

/** 70272 → "70,272 B (68.6 KiB)". */
export function perToken(n: number): string {
  return `${n.toLocaleString("en-US")} B (${(n / 1024).toFixed(1)} KiB)`;
}

const ATTENTION = { mla: "MLA (latent cache)", gqa: "GQA", mha: "MHA" };

/** The plan as labelled lines, in the order the panel shows them. */
export function planLines(p: Plan): [string, string][] {
  const devices = p.tensor_parallel * p.pipeline_parallel;
  const lines: [string, string][] = [
    ["Model", `${p.text_architecture}, ${ATTENTION[p.attention]}, ${p.quantization} (${p.quantization_source}), ${p.dtype}`],
    ["Parameters", `${count(p.params_total)} total, ${count(p.params_active)} active per token`],
    ["Weights", `${gb(p.weight_bytes_total)} total, ${gb(p.weight_bytes_per_device)} per device on ${devices} device${devices > 1 ? "s" : ""}`],
    ["KV cache per token", `${perToken(p.kv_bytes_per_token)} whole model, ${perToken(p.kv_bytes_per_token_per_device)} per device`],
  ];
  if (p.usable_bytes_per_device === null) {
    lines.push(["Device memory", "unknown: give it (GB) or register a node with CUDA devices"]);
    return lines;
  }
  lines.push([
    "Device memory",
    `${gb(p.device_memory_bytes)} × ${p.memory_fraction} = ${gb(p.usable_bytes_per_device)} usable, ${gb(p.free_bytes_per_device)} free after weights`,
  ]);
  lines.push([
    "KV room",
    `${(p.max_kv_tokens ?? 0).toLocaleString("en-US")} tokens, ${p.max_batch_at_context ?? 0} sequences of ${p.context_tokens.toLocaleString("en-US")}`,
  ]);
  const dp = p.attention_data_parallel;
  if (dp) {
    lines.push([
      "Attention data-parallel",
      `${(dp.max_kv_tokens ?? 0).toLocaleString("en-US")} tokens (${(dp.max_kv_tokens_replicated_attention ?? 0).toLocaleString("en-US")} with the attention weights on every rank)`,
    ]);
  }
  return lines;
}
