import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { HitRates, RoutingQuality } from "./HitRates";

const quality: RoutingQuality = {
  decisions: 4, best_prefix_decisions: 3, routed_input_tokens: 1000, reachable_tokens: 780, predicted_tokens: 700,
  input_tokens: 1000, cached_tokens: 620, achieved_hit_rate: 0.62, reachable_hit_rate: 0.78,
};

describe("prompt-cache hit rates", () => {
  afterEach(cleanup);

  it("shows achieved against reachable, as text and as a bar", () => {
    render(<HitRates quality={quality} />);
    const line = screen.getByTestId("hit-rates");
    expect(line.textContent?.trim()).toBe("Prompt tokens served from cache, since start: 62% achieved / 78% reachable by routing");
    const bar = screen.getByRole("img");
    expect(bar.getAttribute("aria-label")).toBe("62% achieved of 78% reachable");
    expect((bar.querySelector(".achieved") as HTMLElement).style.width).toBe("62%");
    expect((bar.querySelector(".reachable") as HTMLElement).style.width).toBe("78%");
    expect(line.title).toContain("620 of 1000 prompt tokens cached");
  });

  it("shows no rate before anything was counted, or when the API could not read it", () => {
    render(<HitRates quality={{ ...quality, achieved_hit_rate: null, reachable_hit_rate: null }} />);
    expect(screen.getByTestId("hit-rates").textContent?.trim()).toBe("Prompt tokens served from cache, since start: – achieved / – reachable by routing");
    cleanup();
    render(<HitRates quality={null} />);
    expect(screen.getByTestId("hit-rates").textContent?.trim()).toBe("Prompt tokens served from cache, since start: – achieved / – reachable by routing");
    expect((screen.getByRole("img").querySelector(".achieved") as HTMLElement).style.width).toBe("0%");
  });
});
