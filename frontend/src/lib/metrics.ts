// The Overview's time series: 15 minutes of 1-second points per deployment, history then live.

import type { CacheTierRates } from "../components/CacheTiers";
import type { SpeculationStats } from "../components/Speculation";

export type Point = {
  t: number;
  tokens_per_second: number | null;
  ttft_p50_ms: number | null;
  ttft_p90_ms: number | null;
  itl_p50_ms: number | null;
  itl_p90_ms: number | null;
  cache_hit_rate: number | null;
  queue_depth: number;
  kv_use: number | null;
  replicas_up: number;
  spec_acceptance_length?: number | null; // this second's, where replicas speculate
  speculation?: SpeculationStats | null; // since the live replicas started; null: none speculates
  cache_tiers?: CacheTierRates | null; // blocks served by each cache since the live replicas started
};

export const WINDOW_SECONDS = 15 * 60;

/** Append live points to a series: sorted by time, no duplicates, only the last 15 minutes. */
export function mergePoints(series: Point[], incoming: Point[], windowSeconds = WINDOW_SECONDS): Point[] {
  const byTime = new Map<number, Point>();
  for (const p of [...series, ...incoming]) byTime.set(p.t, p);
  const sorted = [...byTime.values()].sort((a, b) => a.t - b.t);
  const newest = sorted.length ? sorted[sorted.length - 1].t : 0;
  return sorted.filter((p) => p.t > newest - windowSeconds);
}

/** uPlot's column layout: [times, ...one array per field]; nulls leave gaps. */
export function columns(series: Point[], fields: (keyof Point)[]): (number | null)[][] {
  return [series.map((p) => p.t), ...fields.map((f) => series.map((p) => (p[f] as number | null) ?? null))];
}

/** The newest point's speculation (null when its replicas do not speculate, or no point yet). */
export function latestSpeculation(series: Point[]): SpeculationStats | null {
  return series.length ? (series[series.length - 1].speculation ?? null) : null;
}

/** The newest point's hit rate by cache (null before any replica reported). */
export function latestCacheTiers(series: Point[]): CacheTierRates | null {
  return series.length ? (series[series.length - 1].cache_tiers ?? null) : null;
}

export function latest(series: Point[], field: keyof Point): number | null {
  for (let i = series.length - 1; i >= 0; i--) {
    const v = series[i][field];
    if (v !== null && v !== undefined) return v as number;
  }
  return null;
}

/** Axis labels of a fraction (0..1) as whole percents: uPlot's own labels round small fractions to "0". */
export function percentTicks(splits: number[]): string[] {
  return splits.map((v) => `${Math.round(v * 100)}%`);
}
