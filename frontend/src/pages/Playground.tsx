import { FormEvent, useEffect, useRef, useState } from "react";
import ReconnectingWebSocket from "reconnecting-websocket";
import { speculationLabel } from "../components/Speculation";
import { api, list, wsUrl } from "../lib/api";
import { Answer, applyEvent, newAnswer, stats } from "../lib/playground";

export function Playground() {
  const [deployments, setDeployments] = useState<any[]>([]);
  const [model, setModel] = useState("");
  const [message, setMessage] = useState("");
  const [tools, setTools] = useState("");
  const [toolChoice, setToolChoice] = useState("auto");
  const [format, setFormat] = useState("text");
  const [toolsError, setToolsError] = useState("");
  const [turns, setTurns] = useState<{ question: string; answer: Answer }[]>([]);
  const ws = useRef<ReconnectingWebSocket | null>(null);
  const modelRef = useRef("");
  modelRef.current = model;
  // The deployment's speculation as its replicas measured it (telemetry history, since they started).
  const [spec, setSpec] = useState<{ drafts: number; length: number | null } | null>(null);
  const refreshSpec = () => {
    const slug = modelRef.current;
    if (!slug) return;
    api(`telemetry/history/?deployment=${encodeURIComponent(slug)}`).then((body) => {
      const last = body?.points?.[body.points.length - 1]?.speculation;
      setSpec(last ? { drafts: last.num_drafts ?? 0, length: last.mean_acceptance_length ?? null } : null);
    }, () => setSpec(null));
  };
  useEffect(() => {
    refreshSpec();
    const timer = setInterval(refreshSpec, 3000);
    return () => clearInterval(timer);
  }, [model]); // eslint-disable-line react-hooks/exhaustive-deps
  useEffect(() => {
    list("deployments/").then((ds) => {
      setDeployments(ds);
      setModel((m) => m || ds.find((d: any) => d.replica_states?.ready)?.slug || ds[0]?.slug || "");
    });
    const socket = new ReconnectingWebSocket(wsUrl("/ws/generate/"));
    socket.onmessage = (m) => {
      const event = JSON.parse(m.data);
      const now = performance.now();
      setTurns((ts) => ts.map((t) => (t.answer.id === event.id ? { ...t, answer: applyEvent(t.answer, event, now) } : t)));
    };
    ws.current = socket;
    return () => socket.close();
  }, []);
  const send = (e: FormEvent) => {
    e.preventDefault();
    if (!message.trim() || !model) return;
    let parsedTools: unknown = undefined;
    if (tools.trim()) {
      try {
        parsedTools = JSON.parse(tools);
        setToolsError("");
      } catch (err) {
        setToolsError(`Tools are not valid JSON: ${err}`);
        return;
      }
    }
    const id = `p${Date.now()}`;
    const history = turns.flatMap((t) => [{ role: "user", content: t.question }, { role: "assistant", content: t.answer.text }]);
    setTurns((ts) => [...ts, { question: message, answer: newAnswer(id, performance.now()) }]);
    const request: any = { id, model, messages: [...history, { role: "user", content: message }], max_tokens: 128 };
    if (parsedTools) {
      request.tools = parsedTools;
      request.tool_choice = toolChoice;
    }
    if (format !== "text") request.response_format = { type: format };
    ws.current?.send(JSON.stringify(request));
    setMessage("");
  };
  return (
    <>
      <h1>Playground</h1>
      <form className="inline" onSubmit={send}>
        <label>
          Deployment
          <select value={model} onChange={(e) => setModel(e.target.value)}>
            {deployments.map((d) => <option key={d.slug} value={d.slug}>{d.slug}</option>)}
          </select>
        </label>
        <label>
          Message
          <input size={60} value={message} onChange={(e) => setMessage(e.target.value)} />
        </label>
        <label>
          Output
          <select value={format} onChange={(e) => setFormat(e.target.value)}>
            <option value="text">text</option>
            <option value="json_object">JSON object (constrained)</option>
          </select>
        </label>
        <button type="submit">Send</button>
        <button type="button" onClick={() => setTurns([])}>Clear</button>
      </form>
      <details>
        <summary>Tools (OpenAI "tools" JSON, optional)</summary>
        <label>
          Tools
          <textarea rows={6} cols={90} value={tools} onChange={(e) => setTools(e.target.value)}
            placeholder='[{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]' />
        </label>
        <label>
          Tool choice
          <select value={toolChoice} onChange={(e) => setToolChoice(e.target.value)}>
            <option value="auto">auto (the model decides)</option>
            <option value="required">required (a call, enforced)</option>
            <option value="none">none (tools hidden)</option>
          </select>
        </label>
        {toolsError && <p className="error">{toolsError}</p>}
      </details>
      <p className="muted" data-testid="playground-speculation">
        {spec ? `Speculative decoding (${speculationLabel(deployments.find((d) => d.slug === model) ?? {}) || "on"}): mean acceptance length ${spec.length?.toFixed(2) ?? "–"} over ${spec.drafts} draft runs, this deployment's replicas since they started`
          : "Speculative decoding: off for this deployment (or nothing measured yet)"}
      </p>
      <div role="log" aria-live="polite" className="log">
        {turns.map(({ question, answer }) => {
          const s = stats(answer);
          return (
            <div key={answer.id} className="turn">
              <p><strong>You:</strong> {question}</p>
              <p className="answer"><strong>{model}:</strong> {answer.text}
                {answer.toolCalls.map((c, i) => <code key={i}> → {c.name}({c.arguments})</code>)}
                {answer.error && <span className="error"> {answer.error}</span>}
              </p>
              <p className="muted stats">
                {answer.done ? `done (${answer.finishReason ?? "error"})` : "streaming…"} · TTFT {ms(s.ttft)} · ITL {ms(s.itl)} ·{" "}
                {s.tokensPerSecond ? `${s.tokensPerSecond.toFixed(1)} tok/s` : "– tok/s"} ·{" "}
                <span className="cached">cached tokens predicted {s.predicted ?? "–"} / actual {s.cached ?? "–"}</span> · replica{" "}
                {answer.replica ?? "–"} ({answer.routeReason ?? "–"})
              </p>
            </div>
          );
        })}
      </div>
    </>
  );
}

const ms = (v: number | null) => (v === null ? "–" : `${v.toFixed(1)} ms`);
