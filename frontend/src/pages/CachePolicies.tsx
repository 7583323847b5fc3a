import { FormEvent, useCallback, useEffect, useState } from "react";
import { ErrorText, Field } from "../components/Form";
import { api, fieldErrors, list } from "../lib/api";

// KV tiers and a minimum cached prefix are not built yet (the API refuses them), so the form
// offers only what the engine and gateway honour.
const EMPTY = { name: "", prefix_caching: true, block_size: 16, session_affinity_ttl_seconds: 600 };

export function CachePolicies() {
  const [rows, setRows] = useState<any[]>([]);
  const [form, setForm] = useState<any>(EMPTY);
  const [editing, setEditing] = useState<number | null>(null);
  const [errors, setErrors] = useState<Record<string, string>>({});
  const load = useCallback(() => list("cache-policies/").then(setRows), []);
  useEffect(() => { load(); }, [load]);
  const save = async (e: FormEvent) => {
    e.preventDefault();
    setErrors({});
    const body = { ...form, block_size: Number(form.block_size), session_affinity_ttl_seconds: Number(form.session_affinity_ttl_seconds) };
    try {
      await api(editing ? `cache-policies/${editing}/` : "cache-policies/", { method: editing ? "PATCH" : "POST", body });
      setForm(EMPTY);
      setEditing(null);
      load();
    } catch (err) {
      setErrors(fieldErrors(err));
    }
  };
  const set = (k: string) => (e: any) => setForm({ ...form, [k]: e.target.type === "checkbox" ? e.target.checked : e.target.value });
  return (
    <>
      <h1>Cache policies</h1>
      <table>
        <thead><tr><th>Name</th><th>Prefix caching</th><th>Block size</th><th>Affinity TTL</th><th /></tr></thead>
        <tbody>
          {rows.map((p) => (
            <tr key={p.id}>
              <td>{p.name}</td><td>{p.prefix_caching ? "on" : "off"}</td><td>{p.block_size}</td>
              <td>{p.session_affinity_ttl_seconds}s</td>
              <td><button onClick={() => { setEditing(p.id); setForm(p); }}>Edit</button></td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>{editing ? "Edit policy" : "Create a policy"}</h2>
      <form className="inline card" onSubmit={save} aria-label="Cache policy">
        <Field label="Name" error={errors.name}><input value={form.name} onChange={set("name")} /></Field>
        <Field label="Prefix caching" error={errors.prefix_caching}><input type="checkbox" checked={form.prefix_caching} onChange={set("prefix_caching")} /></Field>
        <Field label="Block size" error={errors.block_size}><input type="number" value={form.block_size} onChange={set("block_size")} /></Field>
        <Field label="Affinity TTL (s)" error={errors.session_affinity_ttl_seconds}><input type="number" value={form.session_affinity_ttl_seconds} onChange={set("session_affinity_ttl_seconds")} /></Field>
        <button type="submit">{editing ? "Save" : "Create"}</button>
        {editing && <button type="button" onClick={() => { setEditing(null); setForm(EMPTY); }}>Cancel</button>}
        <ErrorText errors={errors} />
      </form>
    </>
  );
}
