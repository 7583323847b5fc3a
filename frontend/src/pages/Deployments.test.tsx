import { cleanup, render, screen } from "@testing-library/react";
import { MemoryRouter, Route, Routes } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import { DeploymentDetail } from "./Deployments";

const deployment = vi.hoisted(() => ({ current: {} as Record<string, unknown> }));
vi.mock("../lib/api", async (original) => ({
  ...(await original<typeof import("../lib/api")>()),
  api: vi.fn(async () => deployment.current),
  list: vi.fn(async () => []),
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

  it("shows nothing when every replica is placed", async () => {
    deployment.current = { ...base, placement_error: "" };
    renderDetail();
    await screen.findByTestId("desired");
    expect(screen.queryByTestId("placement-error")).toBeNull();
  });
});
