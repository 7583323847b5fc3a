import { useEffect, useState } from "react";
import { NavLink, Route, Routes } from "react-router-dom";
import { api } from "./lib/api";
import { Login } from "./pages/Login";
import { Overview } from "./pages/Overview";
import { Deployments, DeploymentDetail } from "./pages/Deployments";
import { Models } from "./pages/Models";
import { Inventory } from "./pages/Inventory";
import { CachePolicies } from "./pages/CachePolicies";
import { ApiKeys } from "./pages/ApiKeys";
import { Batches } from "./pages/Batches";
import { Usage } from "./pages/Usage";
import { Events } from "./pages/Events";
import { Playground } from "./pages/Playground";

export type User = { username: string; is_staff: boolean };

export const PAGES: [string, string][] = [
  ["/", "Overview"],
  ["/deployments", "Deployments"],
  ["/models", "Models"],
  ["/inventory", "Inventory"],
  ["/cache-policies", "Cache policies"],
  ["/api-keys", "API keys"],
  ["/batches", "Batches"],
  ["/usage", "Usage"],
  ["/events", "Events"],
  ["/playground", "Playground"],
];

export function App() {
  const [user, setUser] = useState<User | null | undefined>(undefined);
  useEffect(() => {
    api<User>("auth/me/").then(setUser, () => setUser(null));
  }, []);
  if (user === undefined) return <p className="muted">Loading…</p>;
  if (user === null) return <Login onSignedIn={setUser} />;
  const signOut = async () => {
    await api("auth/logout/", { method: "POST" });
    setUser(null);
  };
  return (
    <div className="shell">
      <nav aria-label="Main">
        <strong className="brand">Switchyard</strong>
        {PAGES.map(([to, name]) => (
          <NavLink key={to} to={to} end={to === "/"}>
            {name}
          </NavLink>
        ))}
        <span className="spacer" />
        <span className="muted">{user.username}</span>
        <button onClick={signOut}>Sign out</button>
      </nav>
      <main>
        <Routes>
          <Route path="/" element={<Overview />} />
          <Route path="/deployments" element={<Deployments />} />
          <Route path="/deployments/:slug" element={<DeploymentDetail />} />
          <Route path="/models" element={<Models />} />
          <Route path="/inventory" element={<Inventory />} />
          <Route path="/cache-policies" element={<CachePolicies />} />
          <Route path="/api-keys" element={<ApiKeys />} />
          <Route path="/batches" element={<Batches />} />
          <Route path="/usage" element={<Usage />} />
          <Route path="/events" element={<Events />} />
          <Route path="/playground" element={<Playground />} />
          <Route path="*" element={<p>No such page.</p>} />
        </Routes>
      </main>
    </div>
  );
}
