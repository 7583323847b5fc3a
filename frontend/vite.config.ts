import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// `npm run dev` sends the API and websockets to `make run`'s web server, on $PORT like it.
const web = `127.0.0.1:${process.env.PORT ?? "8000"}`;

// Built into dist/, which Django serves at / (assets under /assets/).
export default defineConfig({
  plugins: [react()],
  build: { outDir: "dist", emptyOutDir: true },
  server: { proxy: { "/api": `http://${web}`, "/ws": { target: `ws://${web}`, ws: true } } },
  test: { environment: "jsdom" },
});
