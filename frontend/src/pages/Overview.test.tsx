import { act, cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";
import { api } from "../lib/api";
import { Overview } from "./Overview";

const rows = vi.hoisted(() => ({ current: [] as Record<string, unknown>[] }));
vi.mock("../lib/api", async (original) => ({
  ...(await original<typeof import("../lib/api")>()),
  api: vi.fn(async () => ({ points: [] })),
  list: vi.fn(async (path: string) => (path === "deployments/" ? rows.current : [])),
}));
vi.mock("reconnecting-websocket", () => ({ default: class { onmessage = null; close() {} } }));
vi.mock("../components/TimeChart", () => ({ TimeChart: () => null })); // uPlot needs a real canvas

const quality = (cached: number, reachable: number) => ({
  decisions: 10, best_prefix_decisions: 9, routed_input_tokens: 1000, reachable_tokens: reachable, predicted_tokens: 0,
  input_tokens: 1000, cached_tokens: cached, achieved_hit_rate: cached / 1000, reachable_hit_rate: reachable / 1000,
});
const deployment = (slug: string, routing_quality: unknown) =>
  ({ slug, mode: "colocated", desired_state: "running", replica_states: { ready: 1 }, routing_quality });

describe("overview", () => {
  afterEach(() => {
    cleanup();
    vi.useRealTimers();
  });

  it("shows each deployment's achieved and reachable prompt-cache hit rate, refreshed", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    rows.current = [deployment("chat", quality(620, 780)), deployment("idle", null)];
    render(<Overview />);
    const lines = await screen.findAllByTestId("hit-rates");
    expect(lines.map((l) => l.textContent?.trim())).toEqual([
      "Prompt tokens served from cache, since start: 62% achieved / 78% reachable by routing",
      "Prompt tokens served from cache, since start: – achieved / – reachable by routing",
    ]);
    rows.current = [deployment("chat", quality(700, 800)), deployment("idle", null)];
    await act(async () => {
      await vi.advanceTimersByTimeAsync(5000);
    });
    expect(screen.getAllByTestId("hit-rates")[0].textContent?.trim()).toBe("Prompt tokens served from cache, since start: 70% achieved / 80% reachable by routing");
  });

  it("shows a speculating deployment's acceptance from its newest point, and nothing for the others", async () => {
    const speculation = {
      num_drafts: 10, drafted_per_position: [10, 8], accepted_per_position: [7, 4], verify_seconds: 0.5,
      draft_seconds: 0.01, mean_acceptance_length: 2.1, acceptance_per_position: [0.7, 0.4],
    };
    const point = (t: number, spec: unknown) => ({ t, queue_depth: 0, replicas_up: 1, speculation: spec });
    vi.mocked(api).mockImplementation(async (path: string) => ({
      points: path.includes("deployment=fast") ? [point(1, null), point(2, speculation)] : [point(2, null)],
    }));
    rows.current = [
      { ...deployment("fast", null), speculative_method: "ngram", speculative_k: 2, draft_model: null },
      { ...deployment("plain", null), speculative_method: "none", speculative_k: 4, draft_model: null },
    ];
    render(<Overview />);
    const panel = await screen.findByTestId("speculation");
    expect(panel.closest("[data-deployment]")?.getAttribute("data-deployment")).toBe("fast");
    expect(screen.getByTestId("speculation-method").textContent).toBe("ngram, k 2");
    expect((await screen.findByTestId("acceptance-length")).textContent).toBe("2.10");
    expect(screen.getAllByTestId("speculation")).toHaveLength(1);
  });

  it("shows each deployment's hit rate by cache from its newest point", async () => {
    const tiers = { queries: 100, blocks: { device: 40, dram: 25, store: 10 }, hit_rate: { device: 0.4, dram: 0.25, store: 0.1 } };
    const point = (t: number, cache_tiers: unknown) => ({ t, queue_depth: 0, replicas_up: 1, cache_tiers });
    vi.mocked(api).mockImplementation(async (path: string) => ({
      points: path.includes("deployment=tiered") ? [point(1, null), point(2, tiers)] : [],
    }));
    rows.current = [deployment("tiered", null), deployment("fresh", null)];
    render(<Overview />);
    await vi.waitFor(() => {
      const lines = screen.getAllByTestId("tier-hit-rates").map((l) => l.textContent);
      expect(lines).toEqual(["Hit rate by cache: device 40% · DRAM 25% · store 10%", "Hit rate by cache: device –"]);
    });
  });
});
