import { cleanup, render, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { AuditEvent, Crashes, EventDetail } from "./Crashes";

const tail = "loading weights\nrequest cmpl-1 admitted\nFatal Python error: Segmentation fault";

function crash(data: Record<string, unknown>, id = 1): AuditEvent {
  return { id, created_at: "2026-12-06T07:00:00Z", verb: "replica.crashed", object_type: "replica", object_id: "7",
           data: { deployment: "demo", log_tail: tail, counted: true, ...data } };
}

describe("replica crashes", () => {
  afterEach(cleanup);

  it("shows a crash's exit code, its cause and its log tail line by line", () => {
    render(<EventDetail event={crash({ exit_code: 70, request_id: "cmpl-1", counted: false })} />);
    const detail = screen.getByTestId("crash-detail");
    expect(detail.textContent).toContain("exit code 70");
    expect(detail.textContent).toContain("request cmpl-1 (suspected; not counted)");
    expect(within(detail).getByText("last 3 log lines")).toBeTruthy();
    expect(detail.querySelector("pre")?.textContent).toBe(tail); // its lines kept as written
  });

  it("names the signal that killed a replica, and says when the agent gave up", () => {
    render(<EventDetail event={crash({ exit_code: -9, signal: "SIGKILL", gave_up: true })} />);
    const text = screen.getByTestId("crash-detail").textContent;
    expect(text).toContain("killed by SIGKILL");
    expect(text).toContain("unknown (counted); the agent gave up on the replica");
  });

  it("shows another event's reason, and nothing for one without", () => {
    const other = { ...crash({}), verb: "replica.starting", data: { reason: "crashed" } };
    const { container } = render(<EventDetail event={other} />);
    expect(container.textContent).toBe("crashed");
    cleanup();
    const bare = render(<EventDetail event={{ ...other, data: {} }} />);
    expect(bare.container.textContent).toBe("");
  });

  it("lists a deployment's crashes, newest first as given", () => {
    render(<Crashes events={[crash({ exit_code: 70 }, 2), crash({ exit_code: -9, signal: "SIGKILL" }, 1)]} />);
    const rows = screen.getByTestId("crashes").querySelectorAll("tbody tr");
    expect(rows).toHaveLength(2);
    expect(rows[0].textContent).toContain("exit code 70");
    expect(rows[1].textContent).toContain("killed by SIGKILL");
    expect(rows[0].querySelector("pre")?.textContent).toBe(tail);
  });

  it("shows no section without crashes", () => {
    const { container } = render(<Crashes events={[]} />);
    expect(container.textContent).toBe("");
  });
});
