import { useCallback, useEffect, useState } from "react";
import { ErrorText } from "../components/Form";
import { api, fieldErrors, list } from "../lib/api";

type Batch = {
  id: string; owner: string; endpoint: string; model: string; status: string; input_filename: string | null;
  output_file_id: string | null; error_file_id: string | null; created_at: string; expires_at: string;
  request_counts: { total: number; completed: number; failed: number };
  errors: { line: number; message: string }[] | null;
};

const ACTIVE = ["validating", "in_progress", "finalizing", "cancelling"];

/** Batches sent through /v1/batches: their progress, counts and files, refreshed while any runs. */
export function Batches() {
  const [rows, setRows] = useState<Batch[]>([]);
  const [errors, setErrors] = useState<Record<string, string>>({});
  const load = useCallback(() => list<Batch>("batches/").then(setRows), []);
  const running = rows.some((b) => ACTIVE.includes(b.status));
  useEffect(() => { load(); }, [load]);
  useEffect(() => {
    if (!running) return;
    const timer = setInterval(load, 2000);
    return () => clearInterval(timer);
  }, [running, load]);
  const cancel = async (b: Batch) => {
    if (!window.confirm(`Cancel ${b.id}? Requests not answered yet go to its error file.`)) return;
    try {
      await api(`batches/${b.id}/cancel/`, { method: "POST" });
      load();
    } catch (err) {
      setErrors(fieldErrors(err));
    }
  };
  return (
    <>
      <h1>Batches</h1>
      <p className="muted">Created with <code>POST /v1/batches</code> (OpenAI's Batch API); they run on the capacity interactive requests leave.</p>
      <ErrorText errors={errors} />
      {rows.length === 0 ? <p className="muted" data-testid="no-batches">No batches yet.</p> : (
        <div className="scroll">
          <table aria-label="Batches">
            <thead><tr><th>Batch</th><th>Owner</th><th>Model</th><th>Status</th><th>Progress</th><th>Created</th><th>Files</th><th /></tr></thead>
            <tbody>
              {rows.map((b) => {
                const { total, completed, failed } = b.request_counts;
                const done = total ? (completed + failed) / total : 0;
                return (
                  <tr key={b.id} data-batch={b.id}>
                    <td><code>{b.id}</code><div className="muted">{b.input_filename} → {b.endpoint}</div></td>
                    <td>{b.owner}</td>
                    <td>{b.model || "–"}</td>
                    <td className="status">{b.status.replace("_", " ")}
                      {b.errors && <div className="muted">{b.errors.length} invalid line(s), first: line {b.errors[0].line}: {b.errors[0].message}</div>}
                    </td>
                    <td>
                      <div className="bar" role="progressbar" aria-valuemin={0} aria-valuemax={total} aria-valuenow={completed + failed}><div style={{ width: `${done * 100}%` }} /></div>
                      <span className="counts">{completed} completed · {failed} failed · {total} total</span>
                    </td>
                    <td>{new Date(b.created_at).toLocaleString()}</td>
                    <td>
                      {b.output_file_id && <a href={`/api/v1/batches/${b.id}/output/`} download>output</a>}{" "}
                      {b.error_file_id && <a href={`/api/v1/batches/${b.id}/errors/`} download>errors</a>}
                    </td>
                    <td>{(b.status === "in_progress" || b.status === "validating") && <button onClick={() => cancel(b)}>Cancel</button>}</td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
    </>
  );
}
