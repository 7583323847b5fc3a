import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { Ranks } from "./Ranks";

describe("ranks", () => {
  afterEach(cleanup);

  it("shows each rank's device and memory", () => {
    render(
      <Ranks
        ranks={[{ rank: 0, device: "cuda:2" }, { rank: 1, device: "cuda:3" }]}
        memory={[{ rank: 1, weights: 2 ** 30, kv_cache: 2 * 2 ** 30, other: 2 ** 20 }]}
      />,
    );
    const items = screen.getByTestId("ranks").querySelectorAll("li");
    expect(items).toHaveLength(2);
    expect(items[0].textContent).toBe("rank 0: cuda:2");
    expect(items[1].textContent).toContain("rank 1: cuda:3");
    expect(items[1].textContent).toContain("weights");
    expect(items[1].textContent).toContain("KV");
  });

  it("shows a single device without a rank number", () => {
    render(<Ranks ranks={[{ rank: 0, device: "cpu:0" }]} />);
    expect(screen.getByTestId("ranks").textContent).toBe("cpu:0");
  });
});
