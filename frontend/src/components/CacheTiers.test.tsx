import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { formatBytes, KVTiersLoad, policyTiers, TierHitRates, TierPolicy, TierUse } from "./CacheTiers";

const policy: TierPolicy = {
  name: "agents", prefix_caching: true, dram_tier_bytes: 2 ** 30, disk_tier_path: "/var/cache/kv",
  disk_tier_bytes: 100 * 2 ** 30, store_tier: true, min_cached_prefix_tokens: 256,
};
const counters = (over: Partial<KVTiersLoad["tiers"][string]>) => ({
  hits: 0, misses: 0, bytes_read: 0, bytes_written: 0, read_seconds: 0, write_seconds: 0, checksum_failures: 0,
  errors: 0, evictions: 0, used_bytes: 0, capacity_bytes: 0, available: true, ...over,
});
const kv: KVTiersLoad = {
  tiers: {
    store: counters({ hits: 3, used_bytes: 512 * 2 ** 20, capacity_bytes: 2 ** 30, available: false }),
    dram: counters({ hits: 40, misses: 2, used_bytes: 256 * 2 ** 20, capacity_bytes: 2 ** 30, checksum_failures: 1 }),
  },
  blocks_loaded: { dram: 38, store: 3 },
  load_seconds: 0.1, dropped_writes: 0, loads_inflight: 0,
};

describe("cache tiers", () => {
  afterEach(cleanup);

  it("shows each cache's share of the prompt blocks looked up, device first", () => {
    const tiers = { queries: 200, blocks: { store: 10, device: 30, dram: 30 }, hit_rate: { store: 0.05, device: 0.15, dram: 0.15 } };
    render(<TierHitRates tiers={tiers} />);
    const line = screen.getByTestId("tier-hit-rates");
    expect(line.textContent).toBe("Hit rate by cache: device 15% · DRAM 15% · store 5%");
    expect(line.title).toBe("200 prompt blocks looked up; 30 served by device, 30 served by DRAM, 10 served by store");
  });

  it("shows no rate before a replica reported, rather than 0%", () => {
    render(<TierHitRates tiers={null} />);
    expect(screen.getByTestId("tier-hit-rates").textContent).toBe("Hit rate by cache: device –");
  });

  it("says what a policy puts behind the device cache", () => {
    expect(policyTiers(policy)).toEqual([
      "DRAM 1.0 GiB per replica", "Mooncake Store (shared by the fleet)", "disk 100 GiB per node at /var/cache/kv",
      "store and disk loads from 256 tokens",
    ]);
    expect(policyTiers({ ...policy, dram_tier_bytes: 0, disk_tier_bytes: 0, disk_tier_path: "", store_tier: false })).toEqual([]);
    expect([formatBytes(0), formatBytes(1536), formatBytes(64 * 2 ** 20)]).toEqual(["0 B", "1.5 KiB", "64 MiB"]);
  });

  it("lists each replica's tiers with their use, hits and state", () => {
    render(<TierUse policy={policy} replicas={[{ id: 7, state: "ready", load: { kv_tiers: kv } }, { id: 8, state: "starting", load: {} }]} />);
    expect(screen.getByTestId("policy-tiers").textContent).toContain("DRAM 1.0 GiB per replica");
    const rows = screen.getByRole("table", { name: "KV tier use" }).querySelectorAll("tbody tr");
    expect([...rows].map((r) => r.getAttribute("data-tier"))).toEqual(["dram", "store"]);
    const cells = [...rows[0].querySelectorAll("td")].map((td) => td.textContent?.trim());
    expect(cells).toEqual(["7", "DRAM", "256 MiB / 1.0 GiB", "40", "2", "38", "1", "available"]);
    expect(rows[1].querySelector("td:last-child")?.textContent).toBe("unreachable");
    expect(screen.getByRole("img", { name: "DRAM of replica 7: 25% used" })).toBeTruthy();
  });

  it("says when a deployment has no tiers", () => {
    render(<TierUse policy={null} replicas={[]} />);
    expect(screen.getByTestId("cache-policy").textContent).toContain("none (the defaults): no KV tiers, the device prefix cache alone");
    expect(screen.queryByRole("table")).toBeNull();
  });
});
