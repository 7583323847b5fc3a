// The REST API with the Django session: same-origin cookies, CSRF token echoed in a header.

export class ApiError extends Error {
  constructor(
    public status: number,
    public body: unknown,
  ) {
    super(formatError(body) || `HTTP ${status}`);
  }
}

/** DRF error bodies ({"detail": "..."} or {"field": ["msg", ...]}) as "field: msg" lines. */
export function formatError(body: unknown): string {
  if (!body || typeof body !== "object") return typeof body === "string" ? body : "";
  return Object.entries(body as Record<string, unknown>)
    .map(([field, value]) => {
      const text = Array.isArray(value) ? value.join(" ") : typeof value === "object" ? formatError(value) : String(value);
      return field === "detail" || field === "non_field_errors" ? text : `${field}: ${text}`;
    })
    .join("\n");
}

export function fieldErrors(err: unknown): Record<string, string> {
  if (!(err instanceof ApiError) || !err.body || typeof err.body !== "object") return {};
  const out: Record<string, string> = {};
  for (const [field, value] of Object.entries(err.body as Record<string, unknown>)) {
    out[field] = Array.isArray(value) ? value.join(" ") : String(value);
  }
  return out;
}

function csrfToken(): string {
  const match = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

export async function api<T = any>(path: string, init: { method?: string; body?: unknown } = {}): Promise<T> {
  const method = init.method ?? "GET";
  const response = await fetch(path.startsWith("/") ? path : `/api/v1/${path}`, {
    method,
    credentials: "same-origin",
    headers: {
      Accept: "application/json",
      ...(init.body !== undefined ? { "Content-Type": "application/json" } : {}),
      ...(method !== "GET" ? { "X-CSRFToken": csrfToken() } : {}),
    },
    body: init.body !== undefined ? JSON.stringify(init.body) : undefined,
  });
  if (response.status === 204) return undefined as T;
  const text = await response.text();
  const body = text ? JSON.parse(text) : undefined;
  if (!response.ok) throw new ApiError(response.status, body);
  return body as T;
}

/** A paginated list endpoint, all pages. */
export async function list<T = any>(path: string): Promise<T[]> {
  let next: string | null = path.startsWith("/") ? path : `/api/v1/${path}`;
  const out: T[] = [];
  while (next) {
    const page: { results: T[]; next: string | null } = await api(next);
    out.push(...page.results);
    next = page.next ? new URL(page.next).pathname + new URL(page.next).search : null;
  }
  return out;
}

export function wsUrl(path: string): string {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
}
