import { FormEvent, useCallback, useEffect, useState } from "react";
import { ErrorText, Field } from "../components/Form";
import { api, fieldErrors, list } from "../lib/api";

export function ApiKeys() {
  const [rows, setRows] = useState<any[]>([]);
  const [form, setForm] = useState({ name: "", rpm_limit: "", tpm_limit: "", weight: "" });
  const [secret, setSecret] = useState<string | null>(null);
  const [errors, setErrors] = useState<Record<string, string>>({});
  const [me, setMe] = useState("");
  const load = useCallback(() => list("api-keys/").then(setRows), []);
  useEffect(() => { load(); }, [load]);
  useEffect(() => { api("auth/me/").then((u) => setMe(u.username)); }, []);
  const create = async (e: FormEvent) => {
    e.preventDefault();
    setErrors({});
    try {
      const created = await api("api-keys/", { method: "POST", body: { name: form.name,
        rpm_limit: form.rpm_limit ? Number(form.rpm_limit) : null, tpm_limit: form.tpm_limit ? Number(form.tpm_limit) : null,
        ...(form.weight ? { weight: Number(form.weight) } : {}) } });
      setSecret(created.secret);
      setForm({ name: "", rpm_limit: "", tpm_limit: "", weight: "" });
      load();
    } catch (err) {
      setErrors(fieldErrors(err));
    }
  };
  const editLimits = async (k: any) => {
    const rpm = window.prompt("Requests per minute (empty: no limit):", k.rpm_limit ?? "");
    if (rpm === null) return;
    const tpm = window.prompt("Tokens per minute (empty: no limit):", k.tpm_limit ?? "");
    if (tpm === null) return;
    const weight = window.prompt("Fair-share weight against other tenants (1: an equal share):", String(k.weight));
    if (weight === null) return;
    try {
      await api(`api-keys/${k.id}/`, { method: "PATCH", body: { rpm_limit: rpm ? Number(rpm) : null, tpm_limit: tpm ? Number(tpm) : null,
        weight: weight ? Number(weight) : 1 } });
      load();
    } catch (err) {
      setErrors(fieldErrors(err));
    }
  };
  const revoke = async (id: number) => {
    if (!window.confirm("Revoke this key? Applications using it stop working.")) return;
    await api(`api-keys/${id}/revoke/`, { method: "POST" });
    load();
  };
  return (
    <>
      <h1>API keys</h1>
      {secret && (
        <div className="card" role="status">
          New key — copy it now, it is not shown again: <div className="secret" data-testid="secret">{secret}</div>
          <button onClick={() => setSecret(null)}>Done</button>
        </div>
      )}
      <div className="scroll"><table aria-label="API keys">
        <thead><tr><th>Name</th><th>Owner</th><th>Prefix</th><th>Limits and share</th><th>Last used</th><th>State</th><th /></tr></thead>
        <tbody>
          {rows.map((k) => (
            <tr key={k.id} data-key={k.name}>
              <td>{k.name}</td><td className="owner">{k.owner}{k.owner === me ? " (you)" : ""}</td><td><code>{k.prefix}…</code></td>
              <td>{k.rpm_limit ?? "∞"} rpm · {k.tpm_limit ?? "∞"} tpm · weight {k.weight}</td>
              <td>{k.last_used_at ? new Date(k.last_used_at).toLocaleString() : "never"}</td>
              <td>{k.revoked ? "revoked" : "active"}</td>
              <td>
                {!k.revoked && <button onClick={() => editLimits(k)}>Edit limits</button>}{" "}
                {!k.revoked && <button onClick={() => revoke(k.id)}>Revoke</button>}
              </td>
            </tr>
          ))}
        </tbody>
      </table></div>
      <h2>Create a key</h2>
      <form className="inline card" onSubmit={create} aria-label="Create a key">
        <Field label="Name" error={errors.name}><input value={form.name} onChange={(e) => setForm({ ...form, name: e.target.value })} /></Field>
        <Field label="Requests/min" error={errors.rpm_limit}><input type="number" value={form.rpm_limit} onChange={(e) => setForm({ ...form, rpm_limit: e.target.value })} /></Field>
        <Field label="Tokens/min" error={errors.tpm_limit}><input type="number" value={form.tpm_limit} onChange={(e) => setForm({ ...form, tpm_limit: e.target.value })} /></Field>
        <Field label="Weight" error={errors.weight}><input type="number" step="any" placeholder="1" value={form.weight} onChange={(e) => setForm({ ...form, weight: e.target.value })} /></Field>
        <button type="submit">Create key</button>
        <ErrorText errors={errors} />
      </form>
    </>
  );
}
