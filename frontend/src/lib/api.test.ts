import { describe, expect, it } from "vitest";
import { ApiError, fieldErrors, formatError } from "./api";

describe("API errors", () => {
  it("formats DRF bodies for people", () => {
    expect(formatError({ detail: "Not found." })).toBe("Not found.");
    expect(formatError({ slug: ["a deployment named 'x' already exists"], replicas: ["too many", "really"] })).toBe(
      "slug: a deployment named 'x' already exists\nreplicas: too many really",
    );
    expect(formatError(undefined)).toBe("");
  });

  it("maps field errors for forms", () => {
    const err = new ApiError(400, { model: ["model 'x' is not ready"], detail: "bad" });
    expect(fieldErrors(err)).toEqual({ model: "model 'x' is not ready", detail: "bad" });
    expect(err.message).toBe("model: model 'x' is not ready\nbad");
    expect(fieldErrors(new Error("x"))).toEqual({});
  });
});
