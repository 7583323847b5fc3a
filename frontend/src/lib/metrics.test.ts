import { describe, expect, it } from "vitest";
import { columns, latest, mergePoints, percentTicks, Point } from "./metrics";

const p = (t: number, tps: number | null = 1): Point => ({
  t, tokens_per_second: tps, ttft_p50_ms: null, ttft_p90_ms: null, itl_p50_ms: 5, itl_p90_ms: 9,
  cache_hit_rate: null, queue_depth: 0, kv_use: 0.1, replicas_up: 1,
});

describe("mergePoints", () => {
  it("orders, de-duplicates and keeps only the window", () => {
    const merged = mergePoints([p(1), p(2)], [p(2, 7), p(3), p(20)], 10);
    expect(merged.map((x) => x.t)).toEqual([20]);
    const kept = mergePoints([p(3), p(1)], [p(2, 7)], 100);
    expect(kept.map((x) => x.t)).toEqual([1, 2, 3]);
    expect(kept[1].tokens_per_second).toBe(7); // the live point replaces the stored one
  });
});

describe("columns and latest", () => {
  it("lays out uPlot columns with gaps, and finds the newest value", () => {
    const series = [p(1, 2), p(2, null)];
    expect(columns(series, ["tokens_per_second", "itl_p90_ms"])).toEqual([[1, 2], [2, null], [9, 9]]);
    expect(latest(series, "tokens_per_second")).toBe(2);
    expect(latest([], "kv_use")).toBeNull();
  });
});

describe("percentTicks", () => {
  it("labels fractions as whole percents instead of rounding them to 0", () => {
    expect(percentTicks([0, 0.25, 0.5, 1])).toEqual(["0%", "25%", "50%", "100%"]);
    expect(percentTicks([0.004, 0.996])).toEqual(["0%", "100%"]);
  });
});
