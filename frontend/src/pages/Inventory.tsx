import { useEffect, useState } from "react";
import { list } from "../lib/api";

export function Inventory() {
  const [nodes, setNodes] = useState<any[]>([]);
  useEffect(() => {
    const load = () => list("nodes/").then(setNodes);
    load();
    const timer = setInterval(load, 2000);
    return () => clearInterval(timer);
  }, []);
  return (
    <>
      <h1>Inventory</h1>
      {nodes.map((n) => (
        <section key={n.name} className="card" data-node={n.name}>
          <h2>{n.name} <span className={n.status === "online" ? "ok" : "bad"}>{n.status}</span></h2>
          <p className="muted">host {n.hostname} · queue {n.queue} · last heartbeat {n.last_heartbeat ? new Date(n.last_heartbeat).toLocaleTimeString() : "never"}</p>
          <table>
            <thead><tr><th>Device</th><th>Memory</th><th>Utilisation</th><th>Health</th></tr></thead>
            <tbody>
              {(n.devices ?? []).map((d: any) => {
                const used = d.memory_total ? d.memory_used / d.memory_total : 0;
                return (
                  <tr key={d.id}>
                    <td>{d.kind}:{d.index} {d.name}</td>
                    <td><span className="bar"><div style={{ width: `${Math.round(used * 100)}%` }} /></span> {(d.memory_used / 2 ** 30).toFixed(1)} / {(d.memory_total / 2 ** 30).toFixed(1)} GiB</td>
                    <td>{Math.round(d.utilization)}%</td>
                    <td>{d.health}</td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </section>
      ))}
    </>
  );
}
