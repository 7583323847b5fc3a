import { useEffect, useState } from "react";
import { Link } from "react-router-dom";
import ReconnectingWebSocket from "reconnecting-websocket";
import { AuditEvent, EventDetail } from "../components/Crashes";
import { api, wsUrl } from "../lib/api";

/** The audit log, newest first, live: filtered by kind and object type (the API filters the
 *  first page; live events are filtered here). */
/** A link to the request inspector for an event that names a request (resumed, crashed under). */
function inspectLink(e: AuditEvent) {
  const rid = e.data?.request_id;
  const slug = e.data?.deployment ?? (e.object_type === "deployment" ? e.object_repr : undefined);
  if (!rid || !slug) return null;
  return <> <Link className="inspect" to={`/deployments/${slug}#req-${rid}`}>inspect request {rid}</Link></>;
}

export function Events() {
  const [events, setEvents] = useState<AuditEvent[]>([]);
  const [verb, setVerb] = useState("");
  const [objectType, setObjectType] = useState("");
  const [kinds, setKinds] = useState<string[]>([]);
  useEffect(() => {
    const query = new URLSearchParams({ ...(verb ? { verb } : {}), ...(objectType ? { object_type: objectType } : {}) });
    api(`events/?${query}`).then((page) => setEvents(page.results));
    const ws = new ReconnectingWebSocket(wsUrl("/ws/events/"));
    ws.onmessage = (m) => {
      const msg = JSON.parse(m.data);
      if (msg.kind !== "event") return;
      const e: AuditEvent = msg.data;
      setKinds((ks) => (ks.includes(e.verb) ? ks : [...ks, e.verb].sort()));
      if ((!verb || e.verb === verb) && (!objectType || e.object_type === objectType)) setEvents((es) => [e, ...es].slice(0, 200));
    };
    return () => ws.close();
  }, [verb, objectType]);
  useEffect(() => {
    api("events/").then((page) => setKinds((ks) => [...new Set([...ks, ...page.results.map((e: AuditEvent) => e.verb)])].sort()));
  }, []);
  const types = [...new Set(events.map((e) => e.object_type).concat(objectType ? [objectType] : []))].filter(Boolean).sort();
  return (
    <>
      <h1>Events</h1>
      <div className="controls card">
        <label>Kind <select aria-label="Kind" value={verb} onChange={(e) => setVerb(e.target.value)}>
          <option value="">all</option>
          {[...new Set([...kinds, "replica.crashed"])].sort().map((k) => <option key={k} value={k}>{k}</option>)}
        </select></label>
        <label>Object <select aria-label="Object type" value={objectType} onChange={(e) => setObjectType(e.target.value)}>
          <option value="">all</option>
          {types.map((t) => <option key={t} value={t}>{t}</option>)}
        </select></label>
      </div>
      {events.length === 0 && <p className="muted" data-testid="no-events">No events{verb || objectType ? " of this kind" : ""} yet.</p>}
      <div className="scroll">
        <table aria-label="Events">
          <thead><tr><th>When</th><th>Who</th><th>Kind</th><th>Object</th><th>Detail</th></tr></thead>
          <tbody>
            {events.map((e) => (
              <tr key={e.id} data-verb={e.verb}>
                <td className="when">{new Date(e.created_at).toLocaleString()}</td>
                <td>{e.actor_label}</td>
                <td>{e.verb}</td>
                <td>{e.object_type} {e.object_repr || e.object_id}</td>
                <td><EventDetail event={e} />{inspectLink(e)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </>
  );
}
