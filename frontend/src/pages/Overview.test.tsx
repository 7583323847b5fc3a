import { act, cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";
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
      "Prompt cache: 62% achieved / 78% reachable",
      "Prompt cache: – achieved / – reachable",
    ]);
    rows.current = [deployment("chat", quality(700, 800)), deployment("idle", null)];
    await act(async () => {
      await vi.advanceTimersByTimeAsync(5000);
    });
    expect(screen.getAllByTestId("hit-rates")[0].textContent?.trim()).toBe("Prompt cache: 70% achieved / 80% reachable");
  });
});
