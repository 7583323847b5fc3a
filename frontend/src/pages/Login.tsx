import { FormEvent, useState } from "react";
import { api, formatError, ApiError } from "../lib/api";
import type { User } from "../App";

export function Login({ onSignedIn }: { onSignedIn: (u: User) => void }) {
  const [username, setUsername] = useState("");
  const [password, setPassword] = useState("");
  const [error, setError] = useState("");
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setError("");
    try {
      await api("auth/me/").catch(() => undefined); // sets the CSRF cookie
      onSignedIn(await api<User>("auth/login/", { method: "POST", body: { username, password } }));
    } catch (err) {
      setError(err instanceof ApiError ? formatError(err.body) : String(err));
    }
  };
  return (
    <div className="login card">
      <h1>Switchyard</h1>
      <form onSubmit={submit}>
        <label>
          Username
          <input value={username} onChange={(e) => setUsername(e.target.value)} autoComplete="username" />
        </label>
        <label>
          Password
          <input type="password" value={password} onChange={(e) => setPassword(e.target.value)} autoComplete="current-password" />
        </label>
        <button type="submit">Sign in</button>
        {error && <p className="error" role="alert">{error}</p>}
      </form>
    </div>
  );
}
