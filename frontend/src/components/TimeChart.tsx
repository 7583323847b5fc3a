import { useEffect, useRef } from "react";
import uPlot from "uplot";
import { percentTicks } from "../lib/metrics";

/** A live time series (uPlot): `data` is [times, ...series]; redrawn in place on each update.
 * `fraction`: the series are fractions, drawn on a fixed 0–100% axis. */
export function TimeChart({
  title,
  labels,
  data,
  fraction = false,
}: {
  title: string;
  labels: string[];
  data: (number | null)[][];
  fraction?: boolean;
}) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  useEffect(() => {
    if (!host.current) return;
    const colors = ["#2f6fd6", "#d6762f", "#2fa36b"];
    plot.current = new uPlot(
      {
        title,
        width: Math.max(240, host.current.clientWidth || 360),
        height: 170,
        // The legend names the series; values show on hover (without one it would read "--").
        legend: { live: false },
        series: [{}, ...labels.map((label, i) => ({ label, stroke: colors[i % colors.length], points: { show: true, size: 4 } }))],
        axes: [{}, fraction ? { size: 50, values: (_u: uPlot, splits: number[]) => percentTicks(splits) } : { size: 50 }],
        scales: fraction ? { y: { range: [0, 1] } } : {},
      },
      data as uPlot.AlignedData,
      host.current,
    );
    // As wide as its place in the grid, and again whenever that changes (the page's width).
    const resize = new ResizeObserver(([entry]) => {
      const width = Math.floor(entry.contentRect.width);
      if (width > 0 && plot.current && Math.abs(plot.current.width - width) > 2) plot.current.setSize({ width, height: 170 });
    });
    resize.observe(host.current);
    return () => {
      resize.disconnect();
      plot.current?.destroy();
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [title, labels.join("|"), fraction]);
  useEffect(() => {
    plot.current?.setData(data as uPlot.AlignedData);
  }, [data]);
  return <div ref={host} className="chart" data-points={data[0]?.length ?? 0} aria-label={title} />;
}
