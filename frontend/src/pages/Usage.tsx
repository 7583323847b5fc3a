import { useEffect, useState } from "react";
import { api } from "../lib/api";

type Row = Record<string, string | number> & { requests: number; input_tokens: number; cached_tokens: number; output_tokens: number };
const RANGES: [string, number][] = [["24 hours", 24], ["7 days", 24 * 7], ["30 days", 24 * 30], ["90 days", 24 * 90]];
const GROUPS: [string, string][] = [["owner", "Owner"], ["api_key", "API key"], ["deployment", "Deployment"]];

/** Tokens and requests per tenant (API key owner), per key or per deployment, and per hour. */
export function Usage() {
  const [hours, setHours] = useState(24);
  const [group, setGroup] = useState("owner");
  const [rows, setRows] = useState<Row[]>([]);
  const [perHour, setPerHour] = useState<Row[]>([]);
  const query = () => `from=${encodeURIComponent(new Date(Date.now() - hours * 3600_000).toISOString())}`;
  useEffect(() => {
    api(`usage/?${query()}&group_by=${group}`).then((body) => setRows(body.results));
    api(`usage/?${query()}&group_by=hour`).then((body) => setPerHour(body.results));
  }, [hours, group]); // eslint-disable-line react-hooks/exhaustive-deps
  const peak = Math.max(1, ...perHour.map((r) => r.input_tokens + r.output_tokens));
  return (
    <>
      <h1>Usage</h1>
      <div className="controls card">
        <label>Over the last <select aria-label="Range" value={hours} onChange={(e) => setHours(Number(e.target.value))}>
          {RANGES.map(([name, h]) => <option key={h} value={h}>{name}</option>)}
        </select></label>{" "}
        <label>by <select aria-label="Group by" value={group} onChange={(e) => setGroup(e.target.value)}>
          {GROUPS.map(([value, name]) => <option key={value} value={value}>{name}</option>)}
        </select></label>{" "}
        <a href={`/api/v1/usage/?${query()}&group_by=${group}&export=csv`} download>Download CSV</a>
      </div>
      <h2>Tokens per hour</h2>
      {perHour.length === 0 ? <p className="muted" data-testid="no-usage">No requests in this range yet (counts arrive within about 10 s).</p> : (
        <div className="hours" role="img" aria-label="Tokens per hour">
          {perHour.map((r) => (
            <div key={String(r.hour)} className="hour" title={`${new Date(String(r.hour)).toLocaleString()}: ${r.input_tokens} in, ${r.output_tokens} out, ${r.requests} requests`}>
              <div className="out" style={{ height: `${(100 * r.output_tokens) / peak}%` }} />
              <div className="in" style={{ height: `${(100 * r.input_tokens) / peak}%` }} />
            </div>
          ))}
        </div>
      )}
      <p className="muted">Input tokens (light) and output tokens (dark) per hour, the hour's start on hover. Cached: input tokens a cache served.</p>
      <div className="scroll">
        <table aria-label="Usage">
          <thead><tr><th>{GROUPS.find(([v]) => v === group)?.[1]}</th>{group === "api_key" && <th>Owner</th>}<th>Requests</th><th>Input tokens</th><th>Cached</th><th>Output tokens</th></tr></thead>
          <tbody>
            {rows.map((r) => (
              <tr key={`${r[group]}-${r.owner}`} data-usage={String(r[group])}>
                <td>{String(r[group] ?? "(console)")}</td>{group === "api_key" && <td>{String(r.owner)}</td>}
                <td className="requests">{r.requests}</td><td>{r.input_tokens}</td><td>{r.cached_tokens}</td><td>{r.output_tokens}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </>
  );
}
