// A deployment's prompt-cache hit rate as routed (achieved) against what the best routing the
// load bound allowed would have reused (reachable): the gap is what routing left on the table.

export type RoutingQuality = {
  decisions: number;
  best_prefix_decisions: number;
  routed_input_tokens: number;
  reachable_tokens: number;
  predicted_tokens: number;
  input_tokens: number;
  cached_tokens: number;
  achieved_hit_rate: number | null;
  reachable_hit_rate: number | null;
};

const pct = (v: number | null | undefined) => (v === null || v === undefined ? "–" : `${Math.round(v * 100)}%`);
const width = (v: number | null | undefined) => `${Math.round(Math.min(Math.max(v ?? 0, 0), 1) * 100)}%`;

export function HitRates({ quality }: { quality: RoutingQuality | null | undefined }) {
  const achieved = quality?.achieved_hit_rate;
  const reachable = quality?.reachable_hit_rate;
  const title = quality
    ? `${quality.cached_tokens} of ${quality.input_tokens} prompt tokens cached; ` +
      `${quality.reachable_tokens} of ${quality.routed_input_tokens} reachable; ` +
      `${quality.best_prefix_decisions} of ${quality.decisions} decisions chose the longest cached prefix`
    : "routing quality unavailable";
  return (
    <p className="muted hit-rates" data-testid="hit-rates" title={title}>
      Prompt tokens served from cache, since start: <strong>{pct(achieved)}</strong> achieved / {pct(reachable)} reachable by routing{" "}
      <span className="bar rates" role="img" aria-label={`${pct(achieved)} achieved of ${pct(reachable)} reachable`}>
        <span className="reachable" style={{ width: width(reachable) }} />
        <span className="achieved" style={{ width: width(achieved) }} />
      </span>
    </p>
  );
}
