import { cleanup, fireEvent, render, screen, within } from "@testing-library/react";
import { MemoryRouter, Route, Routes } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import { api } from "../lib/api";
import { KIMI } from "../lib/plan.sample";
import { DeploymentDetail, Deployments } from "./Deployments";

const deployment = vi.hoisted(() => ({
  current: {} as Record<string, unknown>,
  rows: [] as Record<string, unknown>[],
  replicas: [] as Record<string, unknown>[],
  policies: [] as Record<string, unknown>[],
  models: [] as Record<string, unknown>[],
  plan: {} as Record<string, unknown>,
}));
vi.mock("../lib/api", async (original) => ({
  ...(await original<typeof import("../lib/api")>()),
  api: vi.fn(async (path: string) => (path === "plan/" ? deployment.plan : deployment.current)),
  list: vi.fn(async (path: string) => {
    if (path === "deployments/") return deployment.rows;
    if (path === "models/") return deployment.models;
    if (path.startsWith("replicas/")) return deployment.replicas;
    if (path.startsWith("cache-policies/?name=")) {
      const name = decodeURIComponent(path.split("=")[1]);
      return deployment.policies.filter((p) => p.name === name);
    }
    return [];
  }),
}));

function renderDetail() {
  return render(
    <MemoryRouter initialEntries={["/deployments/demo"]}>
      <Routes><Route path="/deployments/:slug" element={<DeploymentDetail />} /></Routes>
    </MemoryRouter>,
  );
}

const base = { slug: "demo", model: "demo-model", mode: "colocated", desired_state: "running", generation: 1 };

describe("deployment page", () => {
  afterEach(() => {
    cleanup();
    vi.clearAllMocks();
  });

  it("says why replicas cannot be placed", async () => {
    deployment.current = { ...base, placement_error: "1 replica not placed: no online node" };
    renderDetail();
    const note = await screen.findByTestId("placement-error");
    expect(note.textContent).toBe("Cannot place replicas: 1 replica not placed: no online node");
  });

  it("shows the deployment's speculative decoding settings", async () => {
    deployment.current = { ...base, speculative_method: "eagle3", speculative_k: 4, draft_model: "demo-draft" };
    renderDetail();
    expect((await screen.findByTestId("speculation-settings")).textContent).toBe("eagle3 (demo-draft), k 4");
  });

  it("folds failed replicas of earlier generations away with their cause, and shows no stale load", async () => {
    deployment.current = { ...base, generation: 3 };
    const load = { running: 1, waiting: 0, tokens_per_second: 14.35, kv_blocks_total: 10, kv_blocks_free: 4 };
    deployment.replicas = [
      { id: 7, role: "colocated", generation: 3, state: "ready", node: "n", ranks: [], load },
      { id: 5, role: "colocated", generation: 3, state: "failed", node: "n", ranks: [], load, last_error: "exit code 70" },
      { id: 2, role: "colocated", generation: 1, state: "failed", node: "n", ranks: [], load, last_error: "out of memory" },
    ];
    const { container } = renderDetail();
    await screen.findByText("colocated replicas");
    expect(container.querySelector('tr[data-replica="2"]')).toBeNull();
    const earlier = screen.getByTestId("earlier-generations");
    expect(earlier.textContent).toContain("1 failed replica of earlier generations");
    expect(earlier.textContent).toContain("replica 2 (generation 1, colocated): out of memory");
    const failed = container.querySelector('tr[data-replica="5"]')!;
    expect(failed.textContent).not.toContain("14.35");
    expect(container.querySelector('tr[data-replica="7"]')!.textContent).toContain("14.35 tok/s");
    deployment.replicas = [];
  });

  it("shows nothing when every replica is placed", async () => {
    deployment.current = { ...base, placement_error: "" };
    renderDetail();
    await screen.findByTestId("desired");
    expect(screen.queryByTestId("speculation-settings")).toBeNull();
    expect(screen.queryByTestId("placement-error")).toBeNull();
    expect(screen.queryByTestId("failed")).toBeNull();
  });

  it("says a deployment that gave up has failed and must be restarted", async () => {
    const reason = "3 replicas of generation 2 failed (the failure budget is 3)";
    deployment.current = { ...base, status: "failed", failed_reason: reason, placement_error: "" };
    renderDetail();
    const note = await screen.findByTestId("failed");
    expect(note.textContent).toBe(`Failed: ${reason}. No replicas are started until you restart it (or start it).`);
  });

  it("lists a failed deployment as failed", async () => {
    deployment.rows = [
      { ...base, slug: "ok", status: "running", replica_states: { ready: 1 } },
      { ...base, slug: "bad", status: "failed", failed_reason: "3 replicas of generation 1 failed", replica_states: {} },
    ];
    render(<MemoryRouter><Deployments /></MemoryRouter>);
    const statuses = await screen.findAllByTestId("status");
    expect(statuses.map((s) => s.textContent?.trim())).toEqual(["running", "failed"]);
    expect(statuses[1].className).toBe("error");
  });

  it("shows the deployment's cache policy tiers and each replica's use of them", async () => {
    const dram = { hits: 12, misses: 3, bytes_read: 0, bytes_written: 0, read_seconds: 0, write_seconds: 0, checksum_failures: 0,
      errors: 0, evictions: 0, used_bytes: 2 ** 20, capacity_bytes: 4 * 2 ** 20, available: true };
    deployment.policies = [{ name: "agents", prefix_caching: true, dram_tier_bytes: 4 * 2 ** 20, disk_tier_path: "", disk_tier_bytes: 0,
      store_tier: false, min_cached_prefix_tokens: 0 }];
    deployment.replicas = [{ id: 5, role: "colocated", state: "ready", load: { kv_tiers: { tiers: { dram }, blocks_loaded: { dram: 9 },
      load_seconds: 0, dropped_writes: 0, loads_inflight: 0 } } }];
    deployment.current = { ...base, cache_policy: "agents", placement_error: "" };
    renderDetail();
    expect((await screen.findByTestId("policy-tiers")).textContent).toBe("DRAM 4.0 MiB per replica");
    const row = (await screen.findByRole("table", { name: "KV tier use" })).querySelector('tr[data-replica="5"][data-tier="dram"]');
    expect(row?.querySelector(".used")?.textContent?.trim()).toBe("1.0 MiB / 4.0 MiB");
    expect([row?.querySelector(".hits")?.textContent, row?.querySelector(".loaded")?.textContent]).toEqual(["12", "9"]);
    deployment.policies = [];
    deployment.replicas = [];
  });

  it("plans the chosen model live, and again as the layout changes", async () => {
    deployment.models = [{ name: "kimi", is_draft: false }];
    deployment.plan = { ...KIMI, fits: false, usable_bytes_per_device: 68e9 };
    render(<MemoryRouter><Deployments /></MemoryRouter>);
    const form = screen.getByRole("form", { name: "Create a deployment" });
    await within(form).findByRole("option", { name: "kimi" });
    fireEvent.change(within(form).getByLabelText("Model"), { target: { value: "kimi" } });
    fireEvent.change(within(form).getByLabelText("Tensor parallel"), { target: { value: "8" } });
    const fits = await screen.findByTestId("plan-fits");
    expect(fits.textContent).toBe("does not fit: 77.12 GB of weights per device, 68.00 GB usable");
    expect(screen.getByTestId("plan").querySelector('tr[data-plan="KV room"] td')?.textContent).toBe(
      "40,914 tokens, 0 sequences of 262,144");
    const asked = vi.mocked(api).mock.calls.filter(([path]) => path === "plan/");
    expect(asked[asked.length - 1][1]).toEqual({ method: "POST", body: { model: "kimi", tensor_parallel: 8,
      pipeline_parallel: 1, memory_fraction: 0.85 } });
    deployment.models = [];
  });

  it("creates an auto-speculating deployment with or without a draft head", async () => {
    deployment.models = [{ name: "demo-model", is_draft: false }, { name: "demo-draft", is_draft: true }];
    render(<MemoryRouter><Deployments /></MemoryRouter>);
    const form = screen.getByRole("form", { name: "Create a deployment" });
    await within(form).findByRole("option", { name: "demo-model" });
    fireEvent.change(within(form).getByLabelText("Model"), { target: { value: "demo-model" } });
    fireEvent.change(within(form).getByLabelText("Name"), { target: { value: "agents" } });
    fireEvent.change(within(form).getByLabelText("Speculative decoding"), { target: { value: "auto" } });
    expect(within(form).getByRole("option", { name: "none (prompt lookup only)" })).toBeTruthy();
    fireEvent.change(within(form).getByLabelText("Draft model"), { target: { value: "demo-draft" } });
    fireEvent.submit(form);
    await vi.waitFor(() => expect(vi.mocked(api).mock.calls.some(([path]) => path === "deployments/")).toBe(true));
    const [, init] = vi.mocked(api).mock.calls.find(([path]) => path === "deployments/")!;
    expect(init?.body).toMatchObject({ slug: "agents", speculative_method: "auto", speculative_k: 3, draft_model: "demo-draft" });
    deployment.models = [];
  });
});
