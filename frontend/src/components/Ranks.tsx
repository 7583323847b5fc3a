import { formatBytes } from "./CacheTiers";

/** A rank of a replica (GET /api/v1/replicas/{id}/ `ranks`) and its memory (`load.rank_memory`). */
export interface Rank { rank: number; device: string }
export interface RankMemory { rank: number; weights: number; kv_cache: number; other: number }

/** Which device each rank of a replica holds, with its weights / KV cache / other bytes once
 *  the replica has reported them. One rank (a single-device replica) shows just its device. */
export function Ranks({ ranks, memory }: { ranks: Rank[]; memory?: RankMemory[] }) {
  if (!ranks.length) return <span className="muted">–</span>;
  const byRank = new Map((memory ?? []).map((m) => [m.rank, m]));
  return (
    <ul className="ranks" data-testid="ranks">
      {ranks.map((r) => {
        const m = byRank.get(r.rank);
        return (
          <li key={r.rank}>
            {ranks.length > 1 ? `rank ${r.rank}: ` : ""}{r.device}
            {m && <span className="muted"> ({formatBytes(m.weights)} weights, {formatBytes(m.kv_cache)} KV, {formatBytes(m.other)} other)</span>}
          </li>
        );
      })}
    </ul>
  );
}
