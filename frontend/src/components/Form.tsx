import { ReactNode } from "react";

/** A labelled input with the API's message for that field under it. */
export function Field({ label, error, children }: { label: string; error?: string; children: ReactNode }) {
  return (
    <label>
      {label}
      {children}
      {error && <span className="error">{error}</span>}
    </label>
  );
}

export function ErrorText({ errors }: { errors: Record<string, string> }) {
  const general = errors.detail ?? errors.non_field_errors;
  return general ? <p className="error" role="alert">{general}</p> : null;
}
