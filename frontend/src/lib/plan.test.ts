import { describe, expect, it } from "vitest";
import { count, gb, planBody, planLines, perToken } from "./plan";
import { KIMI } from "./plan.sample";

const fields = { model: "kimi", tensor_parallel: "8", pipeline_parallel: 1, quantization: "", device_memory_gb: "",
  memory_fraction: "0.85", context_tokens: "" };

describe("planBody", () => {
  it("asks nothing without a model, and leaves empty fields to the config and the inventory", () => {
    expect(planBody({ ...fields, model: "" })).toBeNull();
    expect(planBody(fields)).toEqual({ model: "kimi", tensor_parallel: 8, pipeline_parallel: 1, memory_fraction: 0.85 });
  });

  it("sends what the operator chose, device memory in bytes", () => {
    const body = planBody({ ...fields, quantization: "fp8", device_memory_gb: "80", context_tokens: "32768" });
    expect(body).toMatchObject({ quantization: "fp8", device_memory_bytes: 80_000_000_000, context_tokens: 32768 });
  });
});

describe("planLines", () => {
  it("says the figures in words", () => {
    expect([gb(595147639776), gb(7077888), count(1026879376368), count(32861500928), perToken(70272)]).toEqual(
      ["595.15 GB", "7.08 MB", "1.03 T", "32.86 B", "70,272 B (68.6 KiB)"]);
    const lines = Object.fromEntries(planLines(KIMI));
    expect(lines["Model"]).toBe("DeepseekV3ForCausalLM, MLA (latent cache), int4-experts (config), bfloat16");
    expect(lines["Weights"]).toBe("595.15 GB total, 77.12 GB per device on 8 devices");
    expect(lines["KV room"]).toBe("40,914 tokens, 0 sequences of 262,144");
    expect(lines["Attention data-parallel"]).toBe("327,312 tokens (0 with the attention weights on every rank)");
  });

  it("says when the device memory is unknown", () => {
    const lines = Object.fromEntries(planLines({ ...KIMI, device_memory_bytes: null, usable_bytes_per_device: null,
      free_bytes_per_device: null, fits: null, max_kv_tokens: null, max_batch_at_context: null }));
    expect(lines["Device memory"]).toMatch(/^unknown/);
    expect(lines["KV room"]).toBeUndefined();
  });
});
