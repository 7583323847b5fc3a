import { render, screen } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import { ErrorText, Field } from "./Form";

describe("form pieces", () => {
  it("labels the input and shows the API's message under it", () => {
    render(<Field label="Name" error="already exists"><input /></Field>);
    expect(screen.getByLabelText(/Name/)).toBeTruthy();
    expect(screen.getByText("already exists")).toBeTruthy();
  });

  it("shows only general errors as an alert", () => {
    const { container } = render(<ErrorText errors={{ slug: "taken" }} />);
    expect(container.textContent).toBe("");
    render(<ErrorText errors={{ detail: "Wrong username or password." }} />);
    expect(screen.getByRole("alert").textContent).toBe("Wrong username or password.");
  });
});
