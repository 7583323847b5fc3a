import { FormEvent, useCallback, useEffect, useState } from "react";
import { ErrorText, Field } from "../components/Form";
import { api, fieldErrors, list } from "../lib/api";

export function Models() {
  const [models, setModels] = useState<any[]>([]);
  const [replicas, setReplicas] = useState<any[]>([]);
  const [deployments, setDeployments] = useState<any[]>([]);
  const [form, setForm] = useState({ name: "", source: "" });
  const [errors, setErrors] = useState<Record<string, string>>({});
  const load = useCallback(() => {
    list("models/").then(setModels);
    list("replicas/?state=starting").then(setReplicas);
    list("deployments/").then(setDeployments);
  }, []);
  useEffect(() => {
    load();
    const timer = setInterval(load, 1000);
    return () => clearInterval(timer);
  }, [load]);
  const register = async (e: FormEvent) => {
    e.preventDefault();
    setErrors({});
    try {
      await api("models/", { method: "POST", body: form });
      setForm({ name: "", source: "" });
      load();
    } catch (err) {
      setErrors(fieldErrors(err));
    }
  };
  const loading = (model: string) => {
    const slugs = new Set(deployments.filter((d) => d.model === model).map((d) => d.slug));
    return replicas.filter((r) => slugs.has(r.deployment));
  };
  return (
    <>
      <h1>Models</h1>
      <table>
        <thead><tr><th>Name</th><th>Architecture</th><th>Parameters</th><th>Size</th><th>Status</th><th>Loading into replicas</th></tr></thead>
        <tbody>
          {models.map((m) => (
            <tr key={m.name} data-model={m.name}>
              <td>{m.name}<div className="muted">{m.source}</div></td>
              <td>{m.architecture}</td>
              <td>{m.parameter_count ? `${(m.parameter_count / 1e6).toFixed(2)}M` : "–"}</td>
              <td>{m.bytes_on_disk ? `${(m.bytes_on_disk / 2 ** 20).toFixed(1)} MiB` : "–"}</td>
              <td>{m.status}{m.status_message && <div className="error">{m.status_message}</div>}</td>
              <td>
                {loading(m.name).map((r) => (
                  <div key={r.id} title={r.progress?.stage}>
                    replica {r.id}: <span className="bar"><div style={{ width: `${Math.round((r.progress?.fraction ?? 0) * 100)}%` }} /></span>{" "}
                    {r.progress?.stage}
                  </div>
                ))}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>Register a model</h2>
      <form className="inline card" onSubmit={register} aria-label="Register a model">
        <Field label="Name" error={errors.name}><input value={form.name} onChange={(e) => setForm({ ...form, name: e.target.value })} /></Field>
        <Field label="Local directory" error={errors.source}><input size={50} value={form.source} onChange={(e) => setForm({ ...form, source: e.target.value })} /></Field>
        <button type="submit">Register</button>
        <ErrorText errors={errors} />
      </form>
    </>
  );
}
