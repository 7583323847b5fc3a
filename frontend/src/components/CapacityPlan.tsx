import { gb, Plan, planLines } from "../lib/plan";

/** The deployment form's live capacity plan: figures, whether the weights fit, and how each was derived. */
export function CapacityPlan({ plan, error, pending }: { plan: Plan | null; error: string; pending: boolean }) {
  if (error) {
    return (
      <section className="card plan" aria-label="Capacity plan" data-testid="plan">
        <strong>Capacity plan</strong> <span className="error" data-testid="plan-error">{error}</span>
      </section>
    );
  }
  if (!plan) {
    return (
      <section className="card plan muted" aria-label="Capacity plan" data-testid="plan">
        {pending ? "Planning…" : "Choose a model to see its capacity plan."}
      </section>
    );
  }
  const fits = plan.fits;
  return (
    <section className="card plan" aria-label="Capacity plan" data-testid="plan" aria-busy={pending}>
      <strong>Capacity plan</strong>{" "}
      {fits === null ? (
        <span className="muted" data-testid="plan-fits">fit unknown</span>
      ) : fits ? (
        <span className="ok" data-testid="plan-fits">fits</span>
      ) : (
        <span className="bad" data-testid="plan-fits">
          does not fit: {gb(plan.weight_bytes_per_device)} of weights per device, {gb(plan.usable_bytes_per_device)} usable
        </span>
      )}
      <table>
        <tbody>
          {planLines(plan).map(([label, text]) => (
            <tr key={label} data-plan={label}>
              <th>{label}</th>
              <td>{text}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <details>
        <summary>How these were derived</summary>
        <ul>{plan.notes.map((note, i) => <li key={i}>{note}</li>)}</ul>
        <p className="muted">Device memory: {plan.device_memory_source}</p>
      </details>
    </section>
  );
}
