import { useEffect, useState } from "react";
import ReconnectingWebSocket from "reconnecting-websocket";
import { TierHitRates } from "../components/CacheTiers";
import { HitRates } from "../components/HitRates";
import { Speculation } from "../components/Speculation";
import { TimeChart } from "../components/TimeChart";
import { api, list, wsUrl } from "../lib/api";
import { columns, latest, latestCacheTiers, latestSpeculation, mergePoints, Point } from "../lib/metrics";

export function Overview() {
  const [deployments, setDeployments] = useState<any[]>([]);
  const [nodes, setNodes] = useState<any[]>([]);
  const [series, setSeries] = useState<Record<string, Point[]>>({});

  useEffect(() => {
    list("deployments/").then(async (deps) => {
      setDeployments(deps);
      const loaded: Record<string, Point[]> = {};
      for (const d of deps) loaded[d.slug] = (await api(`telemetry/history/?deployment=${d.slug}`)).points;
      setSeries((s) => {
        const out = { ...loaded };
        for (const [k, v] of Object.entries(s)) out[k] = mergePoints(out[k] ?? [], v);
        return out;
      });
    });
    list("nodes/").then(setNodes);
    const ws = new ReconnectingWebSocket(wsUrl("/ws/metrics/"));
    ws.onmessage = (m) => {
      const msg = JSON.parse(m.data);
      if (msg.kind !== "metrics") return;
      setSeries((s) => {
        const out = { ...s };
        for (const [slug, p] of Object.entries(msg.points as Record<string, Point>)) out[slug] = mergePoints(out[slug] ?? [], [p]);
        return out;
      });
    };
    // Replica states and routing-quality sums come with the deployments: refreshed now and then.
    const refresh = setInterval(() => list("deployments/").then(setDeployments).catch(() => {}), REFRESH_MS);
    return () => {
      ws.close();
      clearInterval(refresh);
    };
  }, []);

  const online = nodes.filter((n) => n.status === "online").length;
  return (
    <>
      <h1>Overview</h1>
      <p>
        Nodes online: <strong>{online}</strong> / {nodes.length} · Deployments: <strong>{deployments.length}</strong>
      </p>
      {deployments.map((d) => {
        const s = series[d.slug] ?? [];
        const states = d.replica_states ?? {};
        return (
          <section key={d.slug} className="card" data-deployment={d.slug}>
            <h2>
              {d.slug} <span className="muted">({d.mode}, {d.desired_state})</span>{" "}
              <span className={states.ready ? "ok" : "bad"}>{states.ready ?? 0} ready</span>
              {states.failed ? <span className="bad"> · {states.failed} failed</span> : null}
            </h2>
            <p className="muted">
              now: {fmt(latest(s, "tokens_per_second"))} tok/s · queue {fmt(latest(s, "queue_depth"))} · KV use{" "}
              <span data-testid="kv-use">{pct(latest(s, "kv_use"))}</span> · prefix-cache hit rate (blocks found, last
              second) {pct(latest(s, "cache_hit_rate"))}
            </p>
            <HitRates quality={d.routing_quality} />
            <TierHitRates tiers={latestCacheTiers(s)} />
            <Speculation deployment={d} stats={latestSpeculation(s)} />
            <div className="grid">
              <TimeChart title="Output tokens/s" labels={["tok/s"]} data={columns(s, ["tokens_per_second"])} />
              <TimeChart title="TTFT (ms)" labels={["p50", "p90"]} data={columns(s, ["ttft_p50_ms", "ttft_p90_ms"])} />
              <TimeChart title="ITL (ms)" labels={["p50", "p90"]} data={columns(s, ["itl_p50_ms", "itl_p90_ms"])} />
              <TimeChart title="Prefix-cache hit rate (blocks found)" labels={["hit rate"]} data={columns(s, ["cache_hit_rate"])} fraction />
              <TimeChart title="Queue depth" labels={["requests"]} data={columns(s, ["queue_depth"])} />
              <TimeChart title="KV-cache use" labels={["used"]} data={columns(s, ["kv_use"])} fraction />
              {(d.speculative_method ?? "none") !== "none" && (
                <TimeChart title="Acceptance length" labels={["tokens/draft run"]} data={columns(s, ["spec_acceptance_length"])} />
              )}
            </div>
          </section>
        );
      })}
    </>
  );
}

const REFRESH_MS = 5000;
const fmt = (v: number | null) => (v === null ? "–" : Math.round(v * 10) / 10);
// Below 10% one decimal: a big KV cache barely used still shows that it moves.
const pct = (v: number | null) => (v === null ? "–" : v > 0 && v < 0.1 ? `${(v * 100).toFixed(1)}%` : `${Math.round(v * 100)}%`);
