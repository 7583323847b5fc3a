import { cleanup, render, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { Speculation, SpeculationStats, speculationLabel } from "./Speculation";

const stats: SpeculationStats = {
  num_drafts: 20, drafted_per_position: [20, 17, 14], accepted_per_position: [12, 6, 1], verify_seconds: 1.5,
  draft_seconds: 0.01, mean_acceptance_length: 1.95, acceptance_per_position: [0.6, 0.3, 0.05],
};

describe("speculative decoding panel", () => {
  afterEach(cleanup);

  it("shows the method, the mean acceptance length and acceptance by position", () => {
    render(<Speculation deployment={{ speculative_method: "ngram", speculative_k: 3, draft_model: null }} stats={stats} />);
    expect(screen.getByTestId("speculation-method").textContent).toBe("ngram, k 3");
    expect(screen.getByTestId("acceptance-length").textContent).toBe("1.95");
    const table = screen.getByRole("table", { name: "Acceptance by position" });
    const rows = within(table).getAllByRole("row").slice(1);
    expect(rows.map((r) => r.querySelector(".rate")?.textContent)).toEqual(["60%", "30%", "5%"]);
    expect(rows[1].textContent).toContain("6 of 17");
    const bars = within(table).getAllByRole("img");
    expect(bars.map((b) => (b.firstChild as HTMLElement).style.width)).toEqual(["60%", "30%", "5%"]);
    expect(bars[0].getAttribute("aria-label")).toBe("position 1: 60% accepted");
  });

  it("names an eagle3 deployment's draft, and says when nothing is reported yet", () => {
    render(<Speculation deployment={{ speculative_method: "eagle3", speculative_k: 4, draft_model: "demo-draft" }} stats={null} />);
    expect(screen.getByTestId("speculation-method").textContent).toBe("eagle3 (demo-draft), k 4");
    expect(screen.getByTestId("acceptance-length").textContent).toBe("–");
    expect(screen.getByTestId("speculation").textContent).toContain("no replica reports yet");
    expect(screen.queryByRole("table")).toBeNull();
  });

  it("says how to turn speculation on for a deployment that does not speculate", () => {
    render(<Speculation deployment={{ speculative_method: "none", speculative_k: 4 }} stats={null} />);
    const hint = screen.getByTestId("speculation-off");
    expect(hint.textContent).toContain("Speculative decoding is off");
    expect(hint.textContent).toContain("eagle3");
    expect(screen.queryByTestId("speculation")).toBeNull();
    expect(speculationLabel({})).toBe("");
  });
});
