import { describe, expect, it } from "vitest";
import { applyEvent, newAnswer, stats } from "./playground";

describe("a playground answer", () => {
  it("assembles streamed tokens and measures TTFT, ITL and tokens/s", () => {
    let a = newAnswer("r1", 1000);
    a = applyEvent(a, { type: "start", id: "r1", replica: 3, route_reason: "kv_aware", cached_tokens_predicted: 16 }, 1001);
    a = applyEvent(a, { type: "token", id: "r1", text: "The " }, 1050);
    a = applyEvent(a, { type: "token", id: "r1", text: "capital" }, 1060);
    a = applyEvent(a, { type: "token", id: "r1", text: "." }, 1080);
    a = applyEvent(a, { type: "done", id: "r1", finish_reason: "stop",
      usage: { prompt_tokens: 11, completion_tokens: 3, cached_tokens: 16 } }, 1081);
    expect(a.text).toBe("The capital.");
    expect([a.replica, a.routeReason, a.done, a.finishReason]).toEqual([3, "kv_aware", true, "stop"]);
    const s = stats(a);
    expect(s.ttft).toBe(50);
    expect(s.itl).toBe(20); // gaps 10 and 20: the upper median
    expect(s.tokensPerSecond).toBeCloseTo(2 * 1000 / 30);
    expect([s.predicted, s.cached]).toEqual([16, 16]);
  });

  it("has no predicted cached tokens when the gateway could not tell, and none actual before the end", () => {
    let a = newAnswer("r3", 0);
    a = applyEvent(a, { type: "start", id: "r3", replica: 1, route_reason: "least_loaded" }, 1);
    expect([stats(a).predicted, stats(a).cached]).toEqual([null, null]);
    a = applyEvent(a, { type: "start", id: "r3", replica: 1, route_reason: "least_loaded", cached_tokens_predicted: null }, 1);
    a = applyEvent(a, { type: "done", id: "r3", finish_reason: "stop", usage: { prompt_tokens: 5, completion_tokens: 1, cached_tokens: 0 } }, 2);
    expect([stats(a).predicted, stats(a).cached]).toEqual([null, 0]);
  });

  it("shows tool calls and errors", () => {
    let a = newAnswer("r2", 0);
    a = applyEvent(a, { type: "tool_call", tool_call: { function: { name: "get_time", arguments: "{}" } } }, 5);
    a = applyEvent(a, { type: "error", error: { message: "replica 3 stopped" } }, 6);
    expect(a.toolCalls).toEqual([{ name: "get_time", arguments: "{}" }]);
    expect([a.done, a.error, stats(a).ttft]).toEqual([true, "replica 3 stopped", 5]);
  });
});
