import { useEffect, useState } from "react";
import ReconnectingWebSocket from "reconnecting-websocket";
import { AuditEvent, EventDetail } from "../components/Crashes";
import { api, wsUrl } from "../lib/api";

export function Events() {
  const [events, setEvents] = useState<AuditEvent[]>([]);
  useEffect(() => {
    api("events/").then((page) => setEvents(page.results));
    const ws = new ReconnectingWebSocket(wsUrl("/ws/events/"));
    ws.onmessage = (m) => {
      const msg = JSON.parse(m.data);
      if (msg.kind === "event") setEvents((es) => [msg.data, ...es].slice(0, 200));
    };
    return () => ws.close();
  }, []);
  return (
    <>
      <h1>Events</h1>
      <table>
        <thead><tr><th>When</th><th>Who</th><th>What</th><th>Object</th><th>Details</th></tr></thead>
        <tbody>
          {events.map((e) => (
            <tr key={e.id}>
              <td>{new Date(e.created_at).toLocaleTimeString()}</td>
              <td>{e.actor_label}</td>
              <td>{e.verb}</td>
              <td>{e.object_type} {e.object_repr || e.object_id}</td>
              <td><EventDetail event={e} /></td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}
