// Where prompt blocks come from: the device prefix cache or a KV tier behind it (host DRAM, the
// fleet's Mooncake Store, disk). The Overview shows each cache's share of the blocks looked up
// (telemetry's `cache_tiers`); a deployment's page shows its cache policy's tiers and what each
// replica's tiers hold and served (the replica's `load.kv_tiers`).

export type CacheTierRates = {
  queries: number; // prompt blocks looked up since the live replicas started
  blocks: Record<string, number>; // of those, served by each cache
  hit_rate: Record<string, number | null>;
};

export type TierCounters = {
  hits: number;
  misses: number;
  bytes_read: number;
  bytes_written: number;
  read_seconds: number;
  write_seconds: number;
  checksum_failures: number;
  errors: number;
  evictions: number;
  used_bytes: number;
  capacity_bytes: number;
  available: boolean;
};

export type KVTiersLoad = {
  tiers: Record<string, TierCounters>;
  blocks_loaded: Record<string, number>;
  load_seconds: number;
  dropped_writes: number;
  loads_inflight: number;
};

export type TierPolicy = {
  name: string;
  prefix_caching: boolean;
  dram_tier_bytes: number;
  disk_tier_path: string;
  disk_tier_bytes: number;
  store_tier: boolean;
  min_cached_prefix_tokens: number;
};

type Replica = { id: number; state: string; load?: { kv_tiers?: KVTiersLoad } | null };

const ORDER = ["device", "dram", "store", "disk"];
const LABEL: Record<string, string> = { device: "device", dram: "DRAM", store: "store", disk: "disk" };
const label = (tier: string) => LABEL[tier] ?? tier;
const ordered = (tiers: string[]) =>
  [...tiers].sort((a, b) => (ORDER.indexOf(a) + 1 || 99) - (ORDER.indexOf(b) + 1 || 99));
const pct = (v: number | null | undefined) => (v === null || v === undefined ? "–" : `${Math.round(v * 100)}%`);

/** 1536 → "1.5 KiB"; binary units, one decimal below 10. */
export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 || v >= 10 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
}

/** The Overview's line: each cache's share of the prompt blocks looked up. */
export function TierHitRates({ tiers }: { tiers: CacheTierRates | null | undefined }) {
  const names = ordered(Object.keys(tiers?.hit_rate ?? { device: null }));
  const title = tiers
    ? `${tiers.queries} prompt blocks looked up; ` +
      names.map((t) => `${tiers.blocks[t] ?? 0} served by ${label(t)}`).join(", ")
    : "no replica has reported yet";
  return (
    <p className="muted tier-rates" data-testid="tier-hit-rates" title={title}>
      Hit rate by cache:{" "}
      {names.map((t, i) => (
        <span key={t} data-tier={t}>
          {i > 0 && " · "}
          {label(t)} <strong>{pct(tiers?.hit_rate[t])}</strong>
        </span>
      ))}
    </p>
  );
}

/** "DRAM 1.0 GiB per replica", ...: what a cache policy puts behind the device cache. */
export function policyTiers(p: TierPolicy): string[] {
  const out: string[] = [];
  if (p.dram_tier_bytes) out.push(`DRAM ${formatBytes(p.dram_tier_bytes)} per replica`);
  if (p.store_tier) out.push("Mooncake Store (shared by the fleet)");
  if (p.disk_tier_bytes) out.push(`disk ${formatBytes(p.disk_tier_bytes)} per node at ${p.disk_tier_path}`);
  if (out.length && p.min_cached_prefix_tokens) out.push(`store and disk loads from ${p.min_cached_prefix_tokens} tokens`);
  return out;
}

/** A deployment's cache policy and, per replica and tier, its use and what it served. */
export function TierUse({ policy, replicas }: { policy: TierPolicy | null | undefined; replicas: Replica[] }) {
  const configured = policy ? policyTiers(policy) : [];
  const rows = replicas.flatMap((r) => {
    const kv = r.load?.kv_tiers;
    if (!kv) return [];
    return ordered(Object.keys(kv.tiers)).map((tier) => ({ replica: r.id, tier, c: kv.tiers[tier], loaded: kv.blocks_loaded[tier] ?? 0 }));
  });
  return (
    <section data-testid="cache-policy">
      <h2>Cache policy</h2>
      <p>
        {policy ? <strong>{policy.name}</strong> : "none (the defaults)"}:{" "}
        <span data-testid="policy-tiers">
          {configured.length ? configured.join(" · ") : "no KV tiers, the device prefix cache alone"}
        </span>
      </p>
      {rows.length > 0 && (
        <table aria-label="KV tier use">
          <thead>
            <tr><th>Replica</th><th>Tier</th><th>Used</th><th>Hits</th><th>Misses</th><th>Blocks loaded</th><th>Checksum failures</th><th>State</th></tr>
          </thead>
          <tbody>
            {rows.map(({ replica, tier, c, loaded }) => (
              <tr key={`${replica}-${tier}`} data-replica={replica} data-tier={tier}>
                <td>{replica}</td>
                <td>{label(tier)}</td>
                <td className="used">
                  <span className="bar" role="img" aria-label={`${label(tier)} of replica ${replica}: ${pct(c.capacity_bytes ? c.used_bytes / c.capacity_bytes : null)} used`}>
                    <div style={{ width: `${c.capacity_bytes ? Math.min(100, Math.round((100 * c.used_bytes) / c.capacity_bytes)) : 0}%` }} />
                  </span>{" "}
                  {formatBytes(c.used_bytes)} / {formatBytes(c.capacity_bytes)}
                </td>
                <td className="hits">{c.hits}</td>
                <td>{c.misses}</td>
                <td className="loaded">{loaded}</td>
                <td className={c.checksum_failures ? "error" : undefined}>{c.checksum_failures}</td>
                <td className={c.available ? "ok" : "bad"}>{c.available ? "available" : "unreachable"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
