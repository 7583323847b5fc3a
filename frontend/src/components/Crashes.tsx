/** An event of the audit log (GET /api/v1/events/). */
export interface AuditEvent {
  id: number;
  created_at: string;
  actor_label?: string;
  verb: string;
  object_type: string;
  object_id: string;
  object_repr?: string;
  data: Record<string, any>;
}

/** What a `replica.crashed` event's data holds (controlplane/deployments/crashes.py). */
export interface CrashData {
  deployment?: string;
  exit_code?: number | null;
  signal?: string | null;
  error?: string;
  request_id?: string | null;
  counted?: boolean;
  gave_up?: boolean;
  restart_count?: number;
  log_tail?: string;
}

/** How the process ended, in a few words: "exit code 70", "killed by SIGKILL". */
export function exitText(data: CrashData): string {
  if (data.signal) return `killed by ${data.signal}`;
  if (data.exit_code === null || data.exit_code === undefined) return "exit code unknown";
  return `exit code ${data.exit_code}`;
}

/** The request a crash is attributed to, and whether it counted toward the restart limit. */
export function causeText(data: CrashData): string {
  const outcome = data.gave_up ? "; the agent gave up on the replica" : "";
  if (data.request_id) return `request ${data.request_id} (suspected; not counted)${outcome}`;
  return `unknown (counted)${outcome}`;
}

/** The last lines of the replica's log, folded: one line of summary, the lines as written. */
export function LogTail({ text, label }: { text?: string; label?: string }) {
  if (!text) return <span className="muted">no log</span>;
  const lines = text.split("\n");
  return (
    <details className="log-tail">
      <summary>{label ?? `last ${lines.length} log line${lines.length === 1 ? "" : "s"}`}</summary>
      <pre>{text}</pre>
    </details>
  );
}

/** An event's details in the events list: a crash's exit, cause and log tail; otherwise the
 *  reason or error it carries, if any. */
export function EventDetail({ event }: { event: AuditEvent }) {
  const data = event.data ?? {};
  if (event.verb === "replica.crashed") {
    return (
      <div data-testid="crash-detail">
        <strong>{exitText(data)}</strong> · cause {causeText(data)}
        <LogTail text={data.log_tail} />
      </div>
    );
  }
  const note = data.reason ?? data.error ?? data.problem;
  return note ? <span className="muted">{String(note)}</span> : null;
}

/** A deployment's replica crashes, newest first. */
export function Crashes({ events }: { events: AuditEvent[] }) {
  if (!events.length) return null;
  return (
    <section data-testid="crashes">
      <h2>Replica crashes</h2>
      <table>
        <thead><tr><th>When</th><th>Replica</th><th>Exit</th><th>Cause</th><th>Log</th></tr></thead>
        <tbody>
          {events.map((e) => (
            <tr key={e.id} data-crash={e.id}>
              <td>{new Date(e.created_at).toLocaleString()}</td>
              <td>{e.object_id}</td>
              <td>{exitText(e.data)}</td>
              <td>{causeText(e.data)}</td>
              <td><LogTail text={e.data.log_tail} /></td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}
