import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// Built into dist/, which Django serves at / (assets under /assets/).
export default defineConfig({
  plugins: [react()],
  build: { outDir: "dist", emptyOutDir: true },
  server: { proxy: { "/api": "http://127.0.0.1:8000", "/ws": { target: "ws://127.0.0.1:8000", ws: true } } },
  test: { environment: "jsdom" },
});
