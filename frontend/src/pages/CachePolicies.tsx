import { FormEvent, useCallback, useEffect, useState } from "react";
import { policyTiers } from "../components/CacheTiers";
import { ErrorText, Field } from "../components/Form";
import { api, fieldErrors, list } from "../lib/api";

// Sizes are entered in MiB and sent in bytes; 0 (or an empty path) leaves a tier off. The API
// refuses what a replica could not run (a disk tier without a directory, the store where this
// control plane has none) and says why under the field.
const MIB = 2 ** 20;
const EMPTY = {
  name: "", prefix_caching: true, block_size: 16, session_affinity_ttl_seconds: 600,
  dram_tier_mib: 0, disk_tier_path: "", disk_tier_mib: 0, store_tier: false, min_cached_prefix_tokens: 0,
};

const toForm = (p: any) => ({ ...p, dram_tier_mib: p.dram_tier_bytes / MIB, disk_tier_mib: p.disk_tier_bytes / MIB });

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
    const { dram_tier_mib, disk_tier_mib, ...rest } = form;
    const body = {
      ...rest, block_size: Number(form.block_size), session_affinity_ttl_seconds: Number(form.session_affinity_ttl_seconds),
      dram_tier_bytes: Math.round(Number(dram_tier_mib) * MIB), disk_tier_bytes: Math.round(Number(disk_tier_mib) * MIB),
      min_cached_prefix_tokens: Number(form.min_cached_prefix_tokens),
    };
    try {
      await api(editing ? `cache-policies/${editing}/` : "cache-policies/", { method: editing ? "PATCH" : "POST", body });
      setForm(EMPTY);
      setEditing(null);
      load();
    } catch (err) {
      const found = fieldErrors(err);
      // The byte fields are entered as MiB: their messages go under those inputs.
      setErrors({ ...found, dram_tier_mib: found.dram_tier_bytes, disk_tier_mib: found.disk_tier_bytes });
    }
  };
  const set = (k: string) => (e: any) => setForm({ ...form, [k]: e.target.type === "checkbox" ? e.target.checked : e.target.value });
  return (
    <>
      <h1>Cache policies</h1>
      <table>
        <thead><tr><th>Name</th><th>Prefix caching</th><th>Block size</th><th>Affinity TTL</th><th>KV tiers</th><th /></tr></thead>
        <tbody>
          {rows.map((p) => (
            <tr key={p.id} data-policy={p.name}>
              <td>{p.name}</td><td>{p.prefix_caching ? "on" : "off"}</td><td>{p.block_size}</td>
              <td>{p.session_affinity_ttl_seconds}s</td>
              <td className="tiers">{policyTiers(p).join(" · ") || "none"}</td>
              <td><button onClick={() => { setEditing(p.id); setForm(toForm(p)); }}>Edit</button></td>
            </tr>
          ))}
        </tbody>
      </table>
      {rows.length === 0 && <p className="muted" data-testid="empty">No cache policies yet: deployments without one use the defaults (prefix caching on, 16-token blocks, no KV tiers). Create one below.</p>}
      <h2>{editing ? "Edit policy" : "Create a policy"}</h2>
      <form className="inline card" onSubmit={save} aria-label="Cache policy">
        <Field label="Name" error={errors.name}><input value={form.name} onChange={set("name")} /></Field>
        <Field label="Prefix caching" error={errors.prefix_caching}><input type="checkbox" checked={form.prefix_caching} onChange={set("prefix_caching")} /></Field>
        <Field label="Block size" error={errors.block_size}><input type="number" value={form.block_size} onChange={set("block_size")} /></Field>
        <Field label="Affinity TTL (s)" error={errors.session_affinity_ttl_seconds}><input type="number" value={form.session_affinity_ttl_seconds} onChange={set("session_affinity_ttl_seconds")} /></Field>
        <Field label="DRAM tier (MiB per replica)" error={errors.dram_tier_mib}><input type="number" min={0} value={form.dram_tier_mib} onChange={set("dram_tier_mib")} /></Field>
        <Field label="Mooncake Store" error={errors.store_tier}><input type="checkbox" checked={form.store_tier} onChange={set("store_tier")} /></Field>
        <Field label="Disk tier directory" error={errors.disk_tier_path}><input value={form.disk_tier_path} placeholder="/var/cache/switchyard/kv" onChange={set("disk_tier_path")} /></Field>
        <Field label="Disk tier (MiB per node)" error={errors.disk_tier_mib}><input type="number" min={0} value={form.disk_tier_mib} onChange={set("disk_tier_mib")} /></Field>
        <Field label="Min. prefix to load (tokens)" error={errors.min_cached_prefix_tokens}><input type="number" min={0} value={form.min_cached_prefix_tokens} onChange={set("min_cached_prefix_tokens")} /></Field>
        <button type="submit">{editing ? "Save" : "Create"}</button>
        {editing && <button type="button" onClick={() => { setEditing(null); setForm(EMPTY); }}>Cancel</button>}
        <ErrorText errors={errors} />
      </form>
    </>
  );
}
