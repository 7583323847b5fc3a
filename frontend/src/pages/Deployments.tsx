import { FormEvent, useCallback, useEffect, useState } from "react";
import { Link, useParams } from "react-router-dom";
import { TierPolicy, TierUse } from "../components/CacheTiers";
import { CapacityPlan } from "../components/CapacityPlan";
import { AuditEvent, Crashes } from "../components/Crashes";
import { ErrorText, Field } from "../components/Form";
import { RecentRequests } from "../components/RecentRequests";
import { Ranks } from "../components/Ranks";
import { speculationLabel } from "../components/Speculation";
import { api, formatError, fieldErrors, list } from "../lib/api";
import { Plan, planBody } from "../lib/plan";

const PLAN_DELAY_MS = 250; // typing in a number field plans once it pauses
const CRASH_PAGE = 100; // crash events read per refresh
const CRASHES_SHOWN = 10;

/** The capacity plan of the form's model and layout, asked again as the fields change. */
function useLivePlan(body: Record<string, unknown> | null) {
  const [plan, setPlan] = useState<Plan | null>(null);
  const [error, setError] = useState("");
  const [pending, setPending] = useState(false);
  const key = body ? JSON.stringify(body) : "";
  useEffect(() => {
    setError("");
    if (!key) {
      setPlan(null);
      return;
    }
    let current = true; // a slower, older answer must not replace a newer one
    setPending(true);
    const timer = setTimeout(() => {
      api<Plan>("plan/", { method: "POST", body: JSON.parse(key) }).then(
        (answer) => current && (setPlan(answer), setPending(false)),
        (err) => current && (setPlan(null), setError(formatError(err?.body) || String(err?.message ?? err)), setPending(false)),
      );
    }, PLAN_DELAY_MS);
    return () => {
      current = false;
      clearTimeout(timer);
    };
  }, [key]);
  return { plan, error, pending };
}

export function Deployments() {
  const [rows, setRows] = useState<any[]>([]);
  const [models, setModels] = useState<any[]>([]);
  const [form, setForm] = useState({
    slug: "", model: "", mode: "colocated", replicas: 1, prefill_replicas: 1, decode_replicas: 1,
    speculative_method: "none", speculative_k: 3, draft_model: "", tensor_parallel: 1, pipeline_parallel: 1,
    // Planning only (not stored on the deployment): empty means the config's or the inventory's.
    quantization: "", device_memory_gb: "", memory_fraction: "0.85", context_tokens: "",
  });
  const [errors, setErrors] = useState<Record<string, string>>({});
  const live = useLivePlan(planBody(form));
  const load = useCallback(() => list("deployments/").then(setRows), []);
  useEffect(() => {
    load();
    list("models/").then(setModels);
    const timer = setInterval(load, 2000);
    return () => clearInterval(timer);
  }, [load]);
  const create = async (e: FormEvent) => {
    e.preventDefault();
    setErrors({});
    const body: any = { slug: form.slug, model: form.model, mode: form.mode,
      tensor_parallel: Number(form.tensor_parallel), pipeline_parallel: Number(form.pipeline_parallel) };
    if (form.mode === "colocated") body.replicas = Number(form.replicas);
    else Object.assign(body, { replicas: 0, prefill_replicas: Number(form.prefill_replicas), decode_replicas: Number(form.decode_replicas) });
    if (form.speculative_method !== "none") {
      Object.assign(body, { speculative_method: form.speculative_method, speculative_k: Number(form.speculative_k) });
      if (form.speculative_method === "eagle3" || form.speculative_method === "auto") body.draft_model = form.draft_model || null;
    }
    try {
      await api("deployments/", { method: "POST", body });
      setForm({ ...form, slug: "" });
      load();
    } catch (err) {
      setErrors(fieldErrors(err));
    }
  };
  const set = (k: string) => (e: any) => setForm({ ...form, [k]: e.target.value });
  return (
    <>
      <h1>Deployments</h1>
      <table>
        <thead><tr><th>Name</th><th>Model</th><th>Mode</th><th>Status</th><th>Replicas</th></tr></thead>
        <tbody>
          {rows.map((d) => (
            <tr key={d.slug} data-deployment={d.slug}>
              <td><Link to={`/deployments/${d.slug}`}>{d.slug}</Link></td>
              <td>{d.model}</td>
              <td>{d.mode}</td>
              <td className={d.status === "failed" ? "error" : undefined} data-testid="status" title={d.failed_reason || undefined}>
                {d.status ?? d.desired_state}
              </td>
              <td className="states">{Object.entries(d.replica_states ?? {}).map(([s, n]) => `${n} ${s}`).join(", ") || "none"}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {rows.length === 0 && <p className="muted" data-testid="empty">No deployments yet: create one below from a registered model.</p>}
      <h2>Create a deployment</h2>
      <form className="inline card" onSubmit={create} aria-label="Create a deployment">
        <Field label="Name" error={errors.slug}><input value={form.slug} onChange={set("slug")} /></Field>
        <Field label="Model" error={errors.model}>
          <select value={form.model} onChange={set("model")}>
            <option value="">choose…</option>
            {models.filter((m) => !m.is_draft).map((m) => <option key={m.name} value={m.name}>{m.name}</option>)}
          </select>
        </Field>
        <Field label="Mode" error={errors.mode}>
          <select value={form.mode} onChange={set("mode")}>
            <option value="colocated">colocated</option>
            <option value="disaggregated">disaggregated</option>
          </select>
        </Field>
        {form.mode === "colocated" ? (
          <Field label="Replicas" error={errors.replicas}><input type="number" min={0} value={form.replicas} onChange={set("replicas")} /></Field>
        ) : (
          <>
            <Field label="Prefill replicas" error={errors.prefill_replicas}><input type="number" min={0} value={form.prefill_replicas} onChange={set("prefill_replicas")} /></Field>
            <Field label="Decode replicas" error={errors.decode_replicas}><input type="number" min={0} value={form.decode_replicas} onChange={set("decode_replicas")} /></Field>
          </>
        )}
        <Field label="Speculative decoding" error={errors.speculative_method}>
          <select value={form.speculative_method} onChange={set("speculative_method")}>
            <option value="none">none</option>
            <option value="ngram">ngram</option>
            <option value="eagle3">eagle3</option>
            <option value="auto">auto (lookup or a draft head, k measured)</option>
          </select>
        </Field>
        {form.speculative_method !== "none" && (
          <Field label="Draft tokens (k)" error={errors.speculative_k}>
            <input type="number" min={1} max={16} value={form.speculative_k} onChange={set("speculative_k")} />
          </Field>
        )}
        {(form.speculative_method === "eagle3" || form.speculative_method === "auto") && (
          <Field label="Draft model" error={errors.draft_model}>
            <select value={form.draft_model} onChange={set("draft_model")}>
              <option value="">{form.speculative_method === "auto" ? "none (prompt lookup only)" : "choose…"}</option>
              {models.filter((m) => m.is_draft).map((m) => <option key={m.name} value={m.name}>{m.name}</option>)}
            </select>
          </Field>
        )}
        <Field label="Tensor parallel" error={errors.tensor_parallel}>
          <input type="number" min={1} value={form.tensor_parallel} onChange={set("tensor_parallel")} />
        </Field>
        <Field label="Pipeline parallel" error={errors.pipeline_parallel}>
          <input type="number" min={1} value={form.pipeline_parallel} onChange={set("pipeline_parallel")} />
        </Field>
        <Field label="Quantization (plan)">
          <select value={form.quantization} onChange={set("quantization")}>
            <option value="">from the config</option>
            <option value="none">none</option>
            <option value="fp8">fp8</option>
            <option value="int4-experts">int4-experts</option>
          </select>
        </Field>
        <Field label="Device memory, GB (plan)">
          <input type="number" min={1} placeholder="the inventory's" value={form.device_memory_gb} onChange={set("device_memory_gb")} />
        </Field>
        <Field label="Memory fraction (plan)">
          <input type="number" min={0.01} max={1} step={0.01} value={form.memory_fraction} onChange={set("memory_fraction")} />
        </Field>
        <Field label="Context tokens (plan)">
          <input type="number" min={1} placeholder="the model's" value={form.context_tokens} onChange={set("context_tokens")} />
        </Field>
        <button type="submit">Create</button>
        <ErrorText errors={errors} />
      </form>
      <CapacityPlan plan={live.plan} error={live.error} pending={live.pending} />
    </>
  );
}

export function DeploymentDetail() {
  const { slug } = useParams();
  const [dep, setDep] = useState<any>(null);
  const [replicas, setReplicas] = useState<any[]>([]);
  const [error, setError] = useState("");
  const [policy, setPolicy] = useState<TierPolicy | null>(null); // the deployment's cache policy, once read
  const [crashes, setCrashes] = useState<AuditEvent[]>([]);
  const load = useCallback(() => {
    api(`deployments/${slug}/`).then(setDep, (e) => setError(String(e.message)));
    list(`replicas/?deployment__slug=${slug}`).then(setReplicas);
    // The newest crashes of any deployment (one page), this one's kept: its slug is in each.
    api<{ results: AuditEvent[] }>(`events/?verb=replica.crashed&page_size=${CRASH_PAGE}`).then(
      (page) => setCrashes((page?.results ?? []).filter((e) => e.data?.deployment === slug).slice(0, CRASHES_SHOWN)),
      () => setCrashes([]),
    );
  }, [slug]);
  useEffect(() => {
    load();
    const timer = setInterval(load, 1500);
    return () => clearInterval(timer);
  }, [load]);
  const policyName: string | null | undefined = dep?.cache_policy;
  useEffect(() => {
    setPolicy(null);
    if (policyName) list<TierPolicy>(`cache-policies/?name=${encodeURIComponent(policyName)}`).then((found) => setPolicy(found[0] ?? null));
  }, [policyName]);
  const act = async (action: string, body?: unknown) => {
    if (!window.confirm(`${action} ${slug}?`)) return;
    setError("");
    try {
      await api(`deployments/${slug}/${action}/`, { method: "POST", body });
      load();
    } catch (e: any) {
      setError(e.message);
    }
  };
  const scale = () => {
    const n = window.prompt("Replicas:", String(dep?.replicas ?? 1));
    if (n !== null) act("scale", { replicas: Number(n) });
  };
  if (!dep) return <p className="error">{error || "Loading…"}</p>;
  const live = replicas.filter((r) => !["stopped"].includes(r.state));
  // Replicas of earlier generations that failed are history, not the deployment's state now.
  const current = live.filter((r) => !(r.state === "failed" && r.generation < dep.generation));
  const earlier = live.filter((r) => r.state === "failed" && r.generation < dep.generation);
  return (
    <>
      <h1>{dep.slug}</h1>
      <p>
        Model {dep.model} · {dep.mode} · desired <strong data-testid="desired">{dep.desired_state}</strong> · generation {dep.generation}
        {" "}· surge {dep.max_surge ?? 1}
        {speculationLabel(dep) && <> · speculation <span data-testid="speculation-settings">{speculationLabel(dep)}</span></>}
      </p>
      <p>
        <button onClick={() => act("start")}>Start</button> <button onClick={() => act("stop")}>Stop</button>{" "}
        <button onClick={scale}>Scale</button> <button onClick={() => act("drain")}>Drain</button>{" "}
        <button onClick={() => act("restart")}>Restart</button>
      </p>
      {error && <p className="error" role="alert">{error}</p>}
      {dep.status === "failed" && (
        <p className="error" role="status" data-testid="failed">
          Failed: {dep.failed_reason}. No replicas are started until you restart it (or start it).
        </p>
      )}
      {dep.placement_error && <p className="error" data-testid="placement-error">Cannot place replicas: {dep.placement_error}</p>}
      {(!dep.cache_policy || policy?.name === dep.cache_policy) && <TierUse policy={policy} replicas={live} />}
      {["colocated", "prefill", "decode"].map((role) => {
        const rs = current.filter((r) => r.role === role);
        if (!rs.length) return null;
        return (
          <section key={role}>
            <h2>{role} replicas</h2>
            <table>
              <thead><tr><th>#</th><th>State</th><th>Node</th><th>Ranks</th><th>Load</th><th>Loading</th><th>Last error</th></tr></thead>
              <tbody>
                {rs.map((r) => (
                  <tr key={r.id} data-replica={r.id}>
                    <td>{r.id}</td>
                    <td>{r.state}{r.drain_requested_at && r.state === "ready" ? " (drains once replaced)" : ""}</td>
                    <td>{r.node}</td>
                    <td><Ranks ranks={r.ranks ?? []} memory={r.load?.rank_memory} /></td>
                    <td className="muted">
                      {["failed", "stopped", "pending"].includes(r.state) ? "–" : <>{r.load?.running ?? 0} running, {r.load?.waiting ?? 0} waiting, {r.load?.tokens_per_second ?? 0} tok/s,
                      KV {r.load?.kv_blocks_total ? `${r.load.kv_blocks_total - r.load.kv_blocks_free}/${r.load.kv_blocks_total}` : "–"}</>}
                    </td>
                    <td>{r.progress?.stage ? `${r.progress.stage} (${Math.round(r.progress.fraction * 100)}%)` : ""}</td>
                    <td className="error">{r.last_error}</td>
                  </tr>
                ))}
              </tbody>
            </table>
            {rs.map((r) => r.log_tail && (
              <details key={r.id}><summary>Log of replica {r.id}</summary><pre>{r.log_tail}</pre></details>
            ))}
          </section>
        );
      })}
      {earlier.length > 0 && (
        <details data-testid="earlier-generations">
          <summary>{earlier.length} failed replica{earlier.length === 1 ? "" : "s"} of earlier generations</summary>
          <ul>
            {earlier.map((r) => (
              <li key={r.id}>replica {r.id} (generation {r.generation}, {r.role}): {r.last_error || "no error recorded"}</li>
            ))}
          </ul>
        </details>
      )}
      <RecentRequests slug={dep.slug} />
      <Crashes events={crashes} />
    </>
  );
}
