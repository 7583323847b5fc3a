import { useEffect, useState } from "react";
import { api } from "../lib/api";

export type RecentRequest = {
  id: string; at: number; caller: string; replica: number | null; prefill_replica: number | null;
  status: "ok" | "error"; error: string | null; finish_reason: string | null;
  prompt_tokens: number | null; cached_tokens: number | null; completion_tokens: number | null;
  ttft_ms: number | null; total_ms: number; queue_ms: number | null; prefill_ms: number | null; decode_ms: number | null;
  resumed: { from_replica: number; to_replica: number; after_tokens: number }[];
};

const ms = (v: number | null | undefined) => (v === null || v === undefined ? "–" : `${Math.round(v)} ms`);

/** The request inspector: a deployment's last requests, each with its timeline as its replica
 *  timed it (queue, prefill, decode) and its moves to other replicas. */
export function RecentRequests({ slug }: { slug: string }) {
  const [rows, setRows] = useState<RecentRequest[]>([]);
  useEffect(() => {
    const load = () => api(`deployments/${slug}/requests/`).then((body) => setRows(Array.isArray(body?.results) ? body.results : []), () => undefined);
    load();
    const timer = setInterval(load, 5000);
    return () => clearInterval(timer);
  }, [slug]);
  const anchor = typeof window !== "undefined" ? decodeURIComponent(window.location.hash.slice(1)) : "";
  return (
    <section aria-label="Recent requests">
      <h2>Recent requests</h2>
      {rows.length === 0 ? <p className="muted">None since the last restart of Redis (the last 50 are kept).</p> : (
        <table aria-label="Recent requests">
          <thead><tr><th>When</th><th>Request</th><th>Outcome</th><th>Replica</th><th>Tokens (in / cached / out)</th><th>TTFT</th><th>Timeline</th></tr></thead>
          <tbody>
            {rows.map((r) => {
              const total = Math.max(1, (r.queue_ms ?? 0) + (r.prefill_ms ?? 0) + (r.decode_ms ?? 0));
              const part = (v: number | null) => `${(100 * (v ?? 0)) / total}%`;
              return (
                <tr key={r.id} id={`req-${r.id}`} data-request={r.id} className={anchor === `req-${r.id}` ? "highlight" : ""}>
                  <td>{new Date(r.at * 1000).toLocaleString()}</td>
                  <td><code>{r.id}</code><div className="muted">{r.caller}</div></td>
                  <td className={r.status === "ok" ? "" : "error"}>{r.status === "ok" ? r.finish_reason ?? "ok" : r.error}</td>
                  <td>{r.replica ?? "–"}{r.prefill_replica !== null ? ` (prefill ${r.prefill_replica})` : ""}
                    {r.resumed.map((h, i) => <div key={i} className="muted">moved {h.from_replica} → {h.to_replica} after {h.after_tokens} tokens</div>)}
                  </td>
                  <td>{r.prompt_tokens ?? "–"} / {r.cached_tokens ?? "–"} / {r.completion_tokens ?? "–"}</td>
                  <td>{ms(r.ttft_ms)}</td>
                  <td>
                    {r.queue_ms === null ? <span className="muted">{ms(r.total_ms)}</span> : (
                      <div className="timeline" role="img" aria-label={`queue ${ms(r.queue_ms)}, prefill ${ms(r.prefill_ms)}, decode ${ms(r.decode_ms)}`}
                        title={`queue ${ms(r.queue_ms)} · prefill ${ms(r.prefill_ms)} · decode ${ms(r.decode_ms)}`}>
                        <span className="queue" style={{ width: part(r.queue_ms) }} />
                        <span className="prefill" style={{ width: part(r.prefill_ms) }} />
                        <span className="decode" style={{ width: part(r.decode_ms) }} />
                      </div>
                    )}
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
    </section>
  );
}
