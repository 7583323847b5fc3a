// One playground answer assembled from /ws/generate/ events, with its timings.

export type Answer = {
  id: string;
  text: string;
  toolCalls: { name: string; arguments: string }[];
  done: boolean;
  error: string | null;
  replica: number | null;
  routeReason: string | null;
  predictedCached: number | null; // the prefix the gateway found cached on the replica it chose; null: it could not tell
  sentAt: number;
  firstTokenAt: number | null;
  tokenTimes: number[];
  usage: { prompt_tokens: number; completion_tokens: number; cached_tokens?: number } | null;
  finishReason: string | null;
};

export function newAnswer(id: string, sentAt: number): Answer {
  return { id, text: "", toolCalls: [], done: false, error: null, replica: null, routeReason: null, predictedCached: null,
    sentAt, firstTokenAt: null, tokenTimes: [], usage: null, finishReason: null };
}

export function applyEvent(a: Answer, event: any, now: number): Answer {
  switch (event.type) {
    case "start":
      return { ...a, replica: event.replica, routeReason: event.route_reason,
        predictedCached: event.cached_tokens_predicted ?? null };
    case "token":
      return { ...a, text: a.text + event.text, firstTokenAt: a.firstTokenAt ?? now, tokenTimes: [...a.tokenTimes, now] };
    case "tool_call":
      return { ...a, toolCalls: [...a.toolCalls, { name: event.tool_call.function.name, arguments: event.tool_call.function.arguments }],
        firstTokenAt: a.firstTokenAt ?? now };
    case "done":
      return { ...a, done: true, usage: event.usage, finishReason: event.finish_reason };
    case "error":
      return { ...a, done: true, error: event.error?.message ?? "error" };
    default:
      return a;
  }
}

export function stats(a: Answer) {
  const ttft = a.firstTokenAt !== null ? a.firstTokenAt - a.sentAt : null;
  const gaps = a.tokenTimes.slice(1).map((t, i) => t - a.tokenTimes[i]);
  const sorted = [...gaps].sort((x, y) => x - y);
  const itl = sorted.length ? sorted[Math.floor(sorted.length / 2)] : null;
  const span = a.tokenTimes.length > 1 ? a.tokenTimes[a.tokenTimes.length - 1] - a.tokenTimes[0] : null;
  const completion = a.usage?.completion_tokens ?? a.tokenTimes.length;
  const tokensPerSecond = span && span > 0 ? ((completion - 1) * 1000) / span : null;
  return { ttft, itl, tokensPerSecond, predicted: a.predictedCached, cached: a.usage?.cached_tokens ?? null };
}
