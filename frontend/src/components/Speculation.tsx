// A deployment's speculative decoding: its method, how many tokens a draft run yields on average
// (mean acceptance length) and, by position in the run, the share of runs whose guess there was
// accepted — what its live replicas counted since they started (telemetry's `speculation`).

export type SpeculationStats = {
  num_drafts: number;
  drafted_per_position: number[];
  accepted_per_position: number[];
  verify_seconds: number;
  draft_seconds: number;
  mean_acceptance_length: number | null;
  acceptance_per_position: (number | null)[];
};

type Settings = { speculative_method?: string; speculative_k?: number; draft_model?: string | null };

const pct = (v: number | null | undefined) => (v === null || v === undefined ? "–" : `${Math.round(v * 100)}%`);
const width = (v: number | null | undefined) => `${Math.round(Math.min(Math.max(v ?? 0, 0), 1) * 100)}%`;

/** "ngram, k 3" / "eagle3 (draft), k 4"; "" when the deployment does not speculate. */
export function speculationLabel(d: Settings): string {
  const method = d.speculative_method ?? "none";
  if (method === "none") return "";
  return `${method}${d.draft_model ? ` (${d.draft_model})` : ""}, k ${d.speculative_k ?? "?"}`;
}

export function Speculation({ deployment, stats }: { deployment: Settings; stats: SpeculationStats | null | undefined }) {
  const label = speculationLabel(deployment);
  if (!label) {
    // Off by default (the demo too): on a CPU it serves fewer requests under concurrency. Say how to turn it on.
    return (
      <p className="muted speculation-off" data-testid="speculation-off">
        Speculative decoding is off. It pays at low concurrency, most on tool calls and JSON; under load it can cost
        throughput. To turn it on, edit the deployment: speculative method <code>auto</code> (drafts only where the
        replica measures that it pays), <code>eagle3</code> with a draft head (for the demo, <code>demo-draft</code>)
        or <code>ngram</code>, k 3.
      </p>
    );
  }
  const length = stats?.mean_acceptance_length;
  const rates = stats?.acceptance_per_position ?? [];
  return (
    <div className="speculation" data-testid="speculation">
      <p className="muted">
        Speculative decoding: <strong data-testid="speculation-method">{label}</strong> · mean acceptance length{" "}
        <strong data-testid="acceptance-length">{length === null || length === undefined ? "–" : length.toFixed(2)}</strong>
        {stats ? ` tokens per draft run (${stats.num_drafts} runs)` : " (no replica reports yet)"}
      </p>
      {rates.length > 0 && (
        <table className="positions" aria-label="Acceptance by position">
          <thead><tr><th>Draft token</th><th>Accepted</th><th /><th>Drafted</th></tr></thead>
          <tbody>
            {rates.map((rate, i) => (
              <tr key={i} data-position={i + 1}>
                <td>{i + 1}</td>
                <td className="rate">{pct(rate)}</td>
                <td>
                  <span className="bar" role="img" aria-label={`position ${i + 1}: ${pct(rate)} accepted`}>
                    <div style={{ width: width(rate) }} />
                  </span>
                </td>
                <td className="muted">{stats?.accepted_per_position[i] ?? 0} of {stats?.drafted_per_position[i] ?? 0}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  );
}
