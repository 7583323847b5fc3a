import { cleanup, render, screen } from "@testing-library/react";
import { MemoryRouter, Route, Routes } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import { DeploymentDetail } from "./Deployments";

const events = vi.hoisted(() => ({ results: [] as Record<string, unknown>[] }));
vi.mock("../lib/api", async (original) => ({
  ...(await original<typeof import("../lib/api")>()),
  api: vi.fn(async (path: string) =>
    path.startsWith("events/")
      ? { results: events.results, next: null }
      : { slug: "demo", model: "demo-model", mode: "colocated", desired_state: "running", generation: 1 },
  ),
  list: vi.fn(async () => []),
}));

function crash(id: number, deployment: string, data: Record<string, unknown>) {
  return { id, created_at: "2026-12-06T07:00:00Z", verb: "replica.crashed", object_type: "replica",
           object_id: String(id), data: { deployment, log_tail: "last words", ...data } };
}

describe("deployment page crashes", () => {
  afterEach(cleanup);

  it("lists this deployment's replica crashes with exit code and log tail", async () => {
    events.results = [
      crash(3, "demo", { exit_code: 70, request_id: "cmpl-9", counted: false }),
      crash(2, "other", { exit_code: 1 }),
      crash(1, "demo", { exit_code: -9, signal: "SIGKILL", counted: true }),
    ];
    render(
      <MemoryRouter initialEntries={["/deployments/demo"]}>
        <Routes><Route path="/deployments/:slug" element={<DeploymentDetail />} /></Routes>
      </MemoryRouter>,
    );
    const section = await screen.findByTestId("crashes");
    const rows = section.querySelectorAll("tbody tr");
    expect(rows).toHaveLength(2); // the other deployment's is not this one's
    expect(rows[0].textContent).toContain("exit code 70");
    expect(rows[0].textContent).toContain("request cmpl-9 (suspected; not counted)");
    expect(rows[0].querySelector("pre")?.textContent).toBe("last words");
    expect(rows[1].textContent).toContain("killed by SIGKILL");
  });
});
