import { createRoot } from "react-dom/client";
import { BrowserRouter } from "react-router-dom";
import "uplot/dist/uPlot.min.css";
import { App } from "./App";
import "./style.css";

createRoot(document.getElementById("root")!).render(
  <BrowserRouter>
    <App />
  </BrowserRouter>,
);
